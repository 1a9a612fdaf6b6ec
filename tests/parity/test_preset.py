"""test_preset.py — the `gpt` model preset (issue 30): `"model": {"preset": "gpt", "layers",
"dim", "heads", "vocab", "block_size", "bias", "tie"}` is nanoGPT's GPT in ddpd's layers.

A nanoGPT module written by hand here (wte, wpe, drop, blocks of pre-norm attention and
MLP with GELU tanh, ln_f, lm_head without bias, tied to wte) in the ddpd-named PyTorch
modules of pylib.torch_models: ddpd's model.safetensors of a preset job has exactly its
state_dict names and shapes and loads into it with load_state_dict(strict=True). The preset
trains as the same layers written out as a list (bitwise the same losses and weights), and
against PyTorch DDP at W = 2 (join, grad_accum 2) within the parity tolerances."""
import json
from pathlib import Path

import numpy as np
import pytest
from test_gpt import OPTS, check, token_case

from pylib import ddp as H
from pylib import torch_models


@pytest.fixture(autouse=True)
def _skip_code(request):
    H.install_skip_code(request.config)


@pytest.fixture
def work(tmp_path):
    return H.workdir("preset-parity-") if H.os.environ.get("DDPD_TEST_TMP") else tmp_path


def preset(layers=2, dim=16, heads=2, vocab=32, block_size=8, **more):
    return dict({"preset": "gpt", "layers": layers, "dim": dim, "heads": heads, "vocab": vocab,
                 "block_size": block_size}, **more)


def nanogpt_list(layers, dim, heads, vocab, block_size, bias=True, tie=True):
    """nanoGPT's GPT (model.py of karpathy/nanoGPT, dropout 0) written out by hand as ddpd
    layers: transformer.wte, wpe, drop, h[i] = (x + attn(ln_1(x)), x + mlp(ln_2(x))),
    ln_f, lm_head (bias false; lm_head.weight = wte.weight when tied)."""
    ln = {"type": "layernorm", "dim": dim, "bias": bias}
    block = [{"type": "residual", "layers": [ln, {"type": "attention", "dim": dim, "heads": heads, "bias": bias}]},
             {"type": "residual", "layers": [ln, {"type": "linear", "in": dim, "out": 4 * dim, "bias": bias},
                                             {"type": "gelu", "approximate": "tanh"},
                                             {"type": "linear", "in": 4 * dim, "out": dim, "bias": bias}]}]
    head = {"type": "linear", "in": dim, "out": vocab, "bias": False}
    return ([{"type": "embedding", "num": vocab, "dim": dim}, {"type": "position", "max": block_size, "dim": dim},
             {"type": "dropout", "p": 0.0}] + block * layers + [ln, dict(head, tie="0") if tie else head])


def nanogpt_module(layers, dim, heads, vocab, block_size, bias=True, tie=True):
    """The same GPT as a PyTorch module tree built here, block by block, from
    pylib.torch_models' ddpd-named modules (Position, Attention, Residual)."""
    from torch import nn
    one = lambda layer: torch_models.build([layer])[0]  # noqa: E731  (a single module)
    Residual = type(one({"type": "residual", "layers": [{"type": "relu"}]}))
    ln = lambda: nn.LayerNorm(dim) if bias else one({"type": "layernorm", "dim": dim, "bias": False})  # noqa: E731
    mods = [nn.Embedding(vocab, dim), one({"type": "position", "max": block_size, "dim": dim}), nn.Dropout(0.0)]
    for _ in range(layers):
        mods.append(Residual(ln(), one({"type": "attention", "dim": dim, "heads": heads, "bias": bias})))
        mods.append(Residual(ln(), nn.Linear(dim, 4 * dim, bias=bias), nn.GELU(approximate="tanh"),
                             nn.Linear(4 * dim, dim, bias=bias)))
    mods += [ln(), nn.Linear(dim, vocab, bias=False)]
    m = nn.Sequential(*mods)
    if tie:
        m[-1].weight = m[0].weight
    return m


@pytest.mark.parametrize("tie", [True, False])
def test_preset_is_nanogpt(work, tie):
    """One rank, AdamW: the preset's run against the hand-written list's (bitwise), the
    model file against the hand-built module (names, shapes, strict load, the same logits)."""
    H.need_bin()
    torch = H.need_torch()
    L, dim, heads, vocab, T = 2, 16, 2, 32, 8
    listed = nanogpt_list(L, dim, heads, vocab, T, tie=tie)
    case = token_case(listed, vocab, T, 10, 1, OPTS["adamw"], 2, grad_accum=2, seed=17)
    spec = case.write(Path(work) / "data")
    by_list = H.run_ddpd(spec, 1, work, name="list").check_ok(1)
    spec_p = dict(spec, model=preset(L, dim, heads, vocab, T, tie=tie))
    spec_p.pop("input_shape")  # [block_size] by default
    by_preset = H.run_ddpd(spec_p, 1, work, name="preset").check_ok(1)
    assert by_preset.losses() == by_list.losses(), (by_preset.losses(), by_list.losses())
    a, b = by_preset.model(), by_list.model()
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a), "weights differ"
    assert by_preset.of("start", 0)[0]["params"] == by_list.of("start", 0)[0]["params"]

    m = nanogpt_module(L, dim, heads, vocab, T, tie=tie)
    want = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert {k: tuple(np.shape(v)) for k, v in a.items()} == want, "state_dict names and shapes"
    m.load_state_dict({k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in a.items()}, strict=True)
    ref = torch_models.build(listed)
    ref.load_state_dict({k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in a.items()}, strict=True)
    m.eval(), ref.eval()
    x = torch.from_numpy(case.full[0][:3].astype(np.int64))
    with torch.no_grad():
        assert torch.equal(m(x), ref(x)), "the hand-built module computes another function"
    assert (m[-1].weight is m[0].weight) == tie


def test_preset_ddp_against_pytorch(work):
    """W = 2, per-rank files of 12 and 8 samples (join), grad_accum 2, SGD momentum: the
    preset's job against PyTorch DDP on the hand-written list (pylib.torch_models)."""
    L, dim, heads, vocab, T = 1, 8, 2, 24, 8
    case = token_case(nanogpt_list(L, dim, heads, vocab, T), vocab, T, 20, 1, OPTS["sgd-momentum"], 2,
                      grad_accum=2, seed=23)
    x, y = case.full
    case = H.Case.per_rank(case.spec, [x[:12], x[12:]], [y[:12], y[12:]], case.init_sd)

    write = case.write

    def write_preset(data_dir):  # ddpd runs the preset, the reference the list
        return dict(write(data_dir), model=preset(L, dim, heads, vocab, T))
    case.write = write_preset
    run = check(case, work)
    assert run.of("join"), "rank 1 (2 steps) joins"
    text = json.loads((Path(work) / "run.spec.json").read_text())
    assert text["model"]["preset"] == "gpt"


def test_bad_preset_fields_name_them(work):
    """Each wrong field refused before training, its path in the message."""
    H.need_bin()
    case = token_case(nanogpt_list(1, 8, 2, 24, 8), 24, 8, 4, 1, {"type": "sgd", "lr": 0.1}, 2, seed=1)
    spec = case.write(Path(work) / "data")
    bad = [(preset(dim=10, heads=4), "model.heads", "dim 10 is not a multiple of heads 4"),
           (preset(dropout=0.1), "model.dropout", "attn_dropout"),
           (preset(head=2), "model.head", 'did you mean "heads"'),
           (preset(layers=0), "model.layers", "expected an integer from 1 to"),
           (dict(preset(), preset="gtp"), "model.preset", 'expected one of gpt, got "gtp"'),
           ({k: v for k, v in preset().items() if k != "vocab"}, "model.vocab", "missing")]
    for i, (model, path, words) in enumerate(bad):
        s = dict(spec, model=model)
        s.pop("input_shape")
        run = H.run_ddpd(s, 1, work, name=f"bad{i}")
        text = run.stdout + run.stderr
        assert run.rc != 0 and path in text and words in text, (model, path, words, text[-1500:])
