"""torch_models.py — the PyTorch module tree of a ddpd `model` list (CONTRACT.md §2a), the
reference the parity tests train: nn.Sequential of the layers, `residual` an
nn.Sequential subclass whose forward returns x + super().forward(x), `attention` a module
with children `qkv` and `proj` (nanoGPT's CausalSelfAttention without dropout), `position`
a module with a `weight` [max, dim] added over the positions; a `linear` with `tie` shares
the named embedding's Parameter (nanoGPT's lm_head.weight = wte.weight), so the state_dict
holds it under both keys. Its state_dict keys are the ones ddpd writes ("2.1.qkv.weight")."""
import math


def build(model):
    """nn.Sequential for a §2a model list (torch imported here, in the caller's process)."""
    import torch
    from torch import nn

    class Residual(nn.Sequential):
        def forward(self, x):
            return x + super().forward(x)

    class Position(nn.Module):
        def __init__(self, max_t, dim):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(max_t, dim))

        def forward(self, x):
            return x + self.weight[: x.shape[-2]]

    class Attention(nn.Module):
        def __init__(self, dim, heads, causal=True, bias=True):
            super().__init__()
            self.dim, self.heads, self.causal = dim, heads, causal
            self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
            self.proj = nn.Linear(dim, dim, bias=bias)

        def forward(self, x):
            B, T, C = x.shape
            h = self.heads
            q, k, v = self.qkv(x).split(C, dim=2)
            q = q.view(B, T, h, C // h).transpose(1, 2)
            k = k.view(B, T, h, C // h).transpose(1, 2)
            v = v.view(B, T, h, C // h).transpose(1, 2)
            a = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            if self.causal:
                mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
                a = a.masked_fill(~mask, float("-inf"))
            y = torch.softmax(a, dim=-1) @ v
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            return self.proj(y)

    class BatchNorm(nn.modules.batchnorm._BatchNorm):
        """nn.BatchNorm1d on [B, F] and nn.BatchNorm2d on [B, F, H, W], as ddpd's batchnorm."""

        def _check_input_dim(self, x):
            if x.dim() not in (2, 4):
                raise ValueError(f"expected 2D or 4D input (got {x.dim()}D input)")

    def one(l):
        t = l["type"]
        if t == "linear":
            return nn.Linear(l["in"], l["out"], bias=l.get("bias", True))
        if t == "relu":
            return nn.ReLU()
        if t == "tanh":
            return nn.Tanh()
        if t == "sigmoid":
            return nn.Sigmoid()
        if t == "gelu":
            return nn.GELU(approximate=l.get("approximate", "none"))
        if t == "embedding":
            return nn.Embedding(l["num"], l["dim"])
        if t == "position":
            return Position(l["max"], l["dim"])
        if t == "layernorm":
            return nn.LayerNorm(l["dim"], eps=l.get("eps", 1e-5), elementwise_affine=True)
        if t == "attention":
            return Attention(l["dim"], l["heads"], l.get("causal", True), l.get("bias", True))
        if t == "residual":
            return Residual(*[one(i) for i in l["layers"]])
        if t == "dropout":
            return nn.Dropout(l["p"])
        if t == "conv2d":
            return nn.Conv2d(l["in"], l["out"], l["kernel"], stride=l.get("stride", 1), padding=l.get("padding", 0),
                             bias=l.get("bias", True))
        if t == "maxpool2d":
            return nn.MaxPool2d(l["kernel"], stride=l.get("stride"), padding=l.get("padding", 0))
        if t == "avgpool2d":
            return nn.AvgPool2d(l["kernel"], stride=l.get("stride"), padding=l.get("padding", 0))
        if t == "batchnorm":
            return BatchNorm(l["features"], eps=l.get("eps", 1e-5), momentum=l.get("momentum", 0.1))
        if t == "flatten":
            return nn.Flatten()
        raise ValueError(f"no PyTorch module for layer type {t!r}")

    seq = nn.Sequential(*[one(l) for l in model]).float()
    for key, l in walk(model):
        if l["type"] == "linear" and "tie" in l:  # lm_head.weight = wte.weight
            module(seq, key).weight = module(seq, str(l["tie"])).weight
    return seq


def walk(model, prefix=""):
    """(state_dict key, layer) of every layer of a §2a list, nested ones included."""
    for i, l in enumerate(model):
        key = f"{prefix}{i}"
        yield key, l
        if l["type"] == "residual":
            yield from walk(l["layers"], key + ".")


def module(seq, key):
    """The submodule of `seq` whose state_dict prefix is `key` ("2.1")."""
    m = seq
    for part in key.split("."):
        m = m[int(part)]
    return m


def init_state(model, seed):
    """A state_dict (name -> float32 numpy array) of the tree with torch's init of `seed`."""
    import torch
    torch.manual_seed(seed)
    return {k: v.detach().numpy().copy() for k, v in build(model).state_dict().items()}


def uses_ids(model):
    return bool(model) and model[0]["type"] == "embedding"
