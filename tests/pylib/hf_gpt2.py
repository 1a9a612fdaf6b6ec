"""hf_gpt2.py — a GPT-2 in Hugging Face's layout, written by hand in PyTorch (transformers is
not installed here): GPT2LMHeadModel's module names (transformer.wte, .wpe, .h.N.ln_1,
.attn.c_attn, .attn.c_proj, .ln_2, .mlp.c_fc, .mlp.c_proj, .ln_f; lm_head tied to wte),
Conv1D layers whose weight is stored [in, out] (y = x @ W + b), the causal mask buffer
h.N.attn.bias that older files carry, gelu_new. Its files as Hugging Face writes them
(model.safetensors with or without the "transformer." prefix, config.json), and the same
model as a ddpd spec and as ddpd's state_dict (an independent conversion: the tests compare
ddpd's mapping, schema/gpt2.c, with this one)."""
import json
import math
from pathlib import Path

import numpy as np

from pylib.safetensors import st_decode, st_encode


def config(n_layer=2, n_head=2, n_embd=16, vocab_size=37, n_positions=8, eps=1e-5, **extra):
    c = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "activation_function": "gelu_new",
         "n_layer": n_layer, "n_head": n_head, "n_embd": n_embd, "vocab_size": vocab_size,
         "n_positions": n_positions, "n_ctx": n_positions, "layer_norm_epsilon": eps, "n_inner": None,
         "attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1}
    c.update(extra)
    return c


def spec_model(cfg, tie=True):
    """The ddpd layer list of the same GPT-2 (the `gpt` preset's layout: embedding "0",
    position "1", dropout "2", blocks of two residuals from "3", layernorm, lm_head)."""
    d, inner = cfg["n_embd"], cfg.get("n_inner") or 4 * cfg["n_embd"]
    eps = cfg["layer_norm_epsilon"]
    m = [{"type": "embedding", "num": cfg["vocab_size"], "dim": d},
         {"type": "position", "max": cfg["n_positions"], "dim": d}, {"type": "dropout", "p": 0.0}]
    for _ in range(cfg["n_layer"]):
        m.append({"type": "residual", "layers": [{"type": "layernorm", "dim": d, "eps": eps},
                                                 {"type": "attention", "dim": d, "heads": cfg["n_head"]}]})
        m.append({"type": "residual", "layers": [
            {"type": "layernorm", "dim": d, "eps": eps}, {"type": "linear", "in": d, "out": inner},
            {"type": "gelu", "approximate": "tanh"}, {"type": "linear", "in": inner, "out": d}]})
    m.append({"type": "layernorm", "dim": d, "eps": eps})
    head = {"type": "linear", "in": d, "out": cfg["vocab_size"], "bias": False}
    if tie:
        head["tie"] = "0"
    m.append(head)
    return m


def random_state(cfg, seed=0):
    """Hugging Face's tensors (names without the prefix) of a random GPT-2, large enough that
    every weight matters to the logits."""
    rng = np.random.default_rng(seed)
    d, inner, v = cfg["n_embd"], cfg.get("n_inner") or 4 * cfg["n_embd"], cfg["vocab_size"]

    def w(*shape, s=0.2):
        return (rng.standard_normal(shape) * s).astype(np.float32)

    sd = {"wte.weight": w(v, d, s=0.5), "wpe.weight": w(cfg["n_positions"], d, s=0.3)}
    for b in range(cfg["n_layer"]):
        p = f"h.{b}."
        for ln in ("ln_1", "ln_2"):
            sd[p + ln + ".weight"] = 1 + w(d, s=0.1)
            sd[p + ln + ".bias"] = w(d, s=0.1)
        sd[p + "attn.c_attn.weight"] = w(d, 3 * d)
        sd[p + "attn.c_attn.bias"] = w(3 * d, s=0.1)
        sd[p + "attn.c_proj.weight"] = w(d, d)
        sd[p + "attn.c_proj.bias"] = w(d, s=0.1)
        sd[p + "mlp.c_fc.weight"] = w(d, inner)
        sd[p + "mlp.c_fc.bias"] = w(inner, s=0.1)
        sd[p + "mlp.c_proj.weight"] = w(inner, d)
        sd[p + "mlp.c_proj.bias"] = w(d, s=0.1)
    sd["ln_f.weight"] = 1 + w(d, s=0.1)
    sd["ln_f.bias"] = w(d, s=0.1)
    return sd


def save(folder, sd, cfg, prefix=True, mask=True, lm_head=False, cfg_text=None):
    """Writes FOLDER/model.safetensors and FOLDER/config.json as Hugging Face does: names
    under "transformer." (or not), the h.N.attn.bias mask buffers (1, 1, n_positions,
    n_positions) of older files, lm_head.weight (= wte) only when asked."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pre = "transformer." if prefix else ""
    out = {pre + k: v for k, v in sd.items()}
    n = cfg["n_positions"]
    if mask:
        for b in range(cfg["n_layer"]):
            out[f"{pre}h.{b}.attn.bias"] = np.tril(np.ones((n, n), np.float32)).reshape(1, 1, n, n)
    if lm_head:
        out["lm_head.weight"] = sd["wte.weight"]
    (folder / "model.safetensors").write_bytes(st_encode(out))
    (folder / "config.json").write_text(cfg_text if cfg_text is not None else json.dumps(cfg, indent=2))
    return folder / "model.safetensors"


def load(path):
    """Hugging Face's tensors of a file, the prefix taken off and the mask buffers left out."""
    tensors, _ = st_decode(Path(path).read_bytes(), strict=True)
    out = {}
    for k, v in tensors.items():
        k = k[len("transformer."):] if k.startswith("transformer.") else k
        if k.endswith(".attn.bias") or k.endswith(".attn.masked_bias"):
            continue
        out[k] = v
    return out


def to_ddpd(sd, cfg, tie=True):
    """The same weights under ddpd's names and layout (spec_model's keys; Conv1D weights
    transposed to [out, in]); a tied lm_head is wte under both keys, as ddpd writes it."""
    L = cfg["n_layer"]
    out = {"0.weight": sd["wte.weight"], "1.weight": sd["wpe.weight"]}
    for b in range(L):
        a, m, p = 3 + 2 * b, 4 + 2 * b, f"h.{b}."
        out[f"{a}.0.weight"], out[f"{a}.0.bias"] = sd[p + "ln_1.weight"], sd[p + "ln_1.bias"]
        out[f"{a}.1.qkv.weight"] = sd[p + "attn.c_attn.weight"].T.copy()
        out[f"{a}.1.qkv.bias"] = sd[p + "attn.c_attn.bias"]
        out[f"{a}.1.proj.weight"] = sd[p + "attn.c_proj.weight"].T.copy()
        out[f"{a}.1.proj.bias"] = sd[p + "attn.c_proj.bias"]
        out[f"{m}.0.weight"], out[f"{m}.0.bias"] = sd[p + "ln_2.weight"], sd[p + "ln_2.bias"]
        out[f"{m}.1.weight"] = sd[p + "mlp.c_fc.weight"].T.copy()
        out[f"{m}.1.bias"] = sd[p + "mlp.c_fc.bias"]
        out[f"{m}.3.weight"] = sd[p + "mlp.c_proj.weight"].T.copy()
        out[f"{m}.3.bias"] = sd[p + "mlp.c_proj.bias"]
    out[f"{3 + 2 * L}.weight"], out[f"{3 + 2 * L}.bias"] = sd["ln_f.weight"], sd["ln_f.bias"]
    out[f"{4 + 2 * L}.weight"] = sd.get("lm_head.weight", sd["wte.weight"])
    if tie:
        assert np.array_equal(out[f"{4 + 2 * L}.weight"], out["0.weight"])
    return out


# ---------------------------------------------------------------------------------------
# the PyTorch module (built on demand: torch is imported inside)

def build(cfg):
    import torch
    from torch import nn

    class Conv1D(nn.Module):
        def __init__(self, nf, nx):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(nx, nf))
            self.bias = nn.Parameter(torch.zeros(nf))

        def forward(self, x):
            return x @ self.weight + self.bias

    def gelu_new(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    d, h, n = cfg["n_embd"], cfg["n_head"], cfg["n_positions"]
    inner = cfg.get("n_inner") or 4 * d
    eps = cfg["layer_norm_epsilon"]

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("bias", torch.tril(torch.ones(n, n)).view(1, 1, n, n))
            self.c_attn = Conv1D(3 * d, d)
            self.c_proj = Conv1D(d, d)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.c_attn(x).split(d, dim=2)
            q, k, v = (t.view(B, T, h, d // h).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-1, -2)) / math.sqrt(d // h)
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf")).softmax(-1)
            return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, d))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = Conv1D(inner, d)
            self.c_proj = Conv1D(d, inner)

        def forward(self, x):
            return self.c_proj(gelu_new(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(d, eps=eps)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(d, eps=eps)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT2Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(cfg["vocab_size"], d)
            self.wpe = nn.Embedding(n, d)
            self.h = nn.ModuleList(Block() for _ in range(cfg["n_layer"]))
            self.ln_f = nn.LayerNorm(d, eps=eps)

        def forward(self, ids):
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
            for b in self.h:
                x = b(x)
            return self.ln_f(x)

    class GPT2LMHeadModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = GPT2Model()
            self.lm_head = nn.Linear(d, cfg["vocab_size"], bias=False)
            if cfg.get("tie_word_embeddings", True):
                self.lm_head.weight = self.transformer.wte.weight

        def forward(self, ids):
            return self.lm_head(self.transformer(ids))

    return GPT2LMHeadModel()


def module_from(sd, cfg):
    """The module with Hugging Face's tensors `sd` (load() or random_state()), loaded strictly
    (the mask buffers are the module's own)."""
    import torch
    m = build(cfg)
    full = {("" if k.startswith("lm_head") else "transformer.") + k: torch.from_numpy(np.asarray(v))
            for k, v in sd.items()}
    full.setdefault("lm_head.weight", full["transformer.wte.weight"])
    for b in range(cfg["n_layer"]):
        full[f"transformer.h.{b}.attn.bias"] = m.transformer.h[b].attn.bias
    m.load_state_dict(full, strict=True)
    return m.eval()


def logits(sd, cfg, ids):
    """[B, T, vocab] logits of the module for int ids [B, T], as a float64 numpy array."""
    import torch
    with torch.no_grad():
        return module_from(sd, cfg)(torch.from_numpy(np.asarray(ids, np.int64))).double().numpy()


def loss(sd, cfg, x, y):
    """Mean cross entropy of the module on windows x -> y ([B, T] ids each)."""
    import torch
    with torch.no_grad():
        lg = module_from(sd, cfg)(torch.from_numpy(np.asarray(x, np.int64)))
        return float(torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]),
                                                       torch.from_numpy(np.asarray(y, np.int64)).reshape(-1)))
