"""test_gpt.py — the v2 layers (CONTRACT.md §2a) through `ddpd run` against PyTorch 1.13 on
the same module tree (pylib.torch_models: residual = nn.Sequential returning x + inner(x),
attention with children qkv and proj), from the same init.from weights on the same data.

Per layer (one rank, SGD, a few steps: the losses check the forward, the weights after each
update the backward): layernorm, attention causal and not (T = 1, one head, odd sizes),
gelu tanh, nested residuals on [B, T, dim] float inputs, and embedding + position with
sequence cross_entropy on int32 ids. End to end: a 2-block GPT (vocab 32, T 8, dim 16,
2 heads) trained by 2 ranks with AdamW, grad_accum 2 and uneven shards (join) against
PyTorch DDP (gloo), and the same at W = 1 and W = 3, each with SGD momentum and AdamW; a
one-block GPT whose rows are longer than a warp (dim 48, T 40, vocab 70) at W = 1, 2, 3. ddpd's
model.safetensors loads into the PyTorch tree with load_state_dict(strict=True). A GPT with
dropout resumed from a checkpoint gives exactly the numbers of the uninterrupted run (the
masks depend on the step, not on how many forwards this process ran). Tokens files per rank
(`{rank}`, issue 28): each rank's own file, even and uneven (join), against PyTorch DDP on
the same windows, and resumed exactly from a checkpoint.
Tolerances are the existing parity tests' (losses 1e-5 relative, weights 1e-5 + 1e-5·|ref|)."""
from pathlib import Path

import numpy as np
import pytest

from pylib import ddp as H
from pylib import torch_models


@pytest.fixture(autouse=True)
def _skip_code(request):
    H.install_skip_code(request.config)


@pytest.fixture
def work(tmp_path):
    return H.workdir("gpt-parity-") if H.os.environ.get("DDPD_TEST_TMP") else tmp_path


def spec_of(model, input_shape, loss, optimizer, batch_size, grad_accum=1, epochs=1):
    return {"name": "gpt-parity", "device": "cpu", "model": model, "input_shape": input_shape, "loss": loss,
            "optimizer": optimizer, "batch_size": batch_size, "epochs": epochs, "grad_accum": grad_accum,
            "log_every": 1}


def check(case, work, data=None):
    """Runs the case on both sides; asserts losses, final weights and the strict load.
    `data`: written into the data folder after the case's files, returns the spec's data
    object that ddpd reads instead of theirs (the reference reads the case's samples)."""
    H.need_bin()
    H.need_torch()
    spec = case.write(Path(work) / "data")
    if data:
        spec["data"] = data(Path(work) / "data")
    run = H.run_ddpd(spec, case.world, work)
    run.check_ok(case.world)
    ref = H.torch_ddp(case, work)
    import torch
    tree = torch_models.build(case.spec["model"])
    start = run.of("start", 0)[0]
    # parameters(), like ddpd, counts a tied weight once (the state_dict names it twice)
    assert start["params"] == sum(p.numel() for p in tree.parameters()), "start.params"
    assert start.get("activation_bytes", 0) > 0, f"start.activation_bytes: {start}"
    problems = [m for m in (H.compare_all_losses(run.losses(), ref), H.compare_tensors(run.model(), ref[0]["state"]))
                if m]
    assert not problems, "\n".join(problems)

    got = run.model()
    tree.load_state_dict({k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in got.items()},
                         strict=True)
    return run


def float_case(model, T, fin, fout, n=12, world=1, batch_size=3, seed=0, steps_opt=None):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, T, fin)).astype(np.float32)
    y = rng.uniform(-1, 1, size=(n, T, fout)).astype(np.float32)
    opt = steps_opt or {"type": "sgd", "lr": 0.1}
    spec = spec_of(model, [T, fin], "mse", opt, batch_size)
    return H.Case.sharded(spec, world, x, y, torch_models.init_state(model, seed))


def lin(i, o, bias=True):
    return {"type": "linear", "in": i, "out": o, "bias": bias}


def test_layernorm(work):
    model = [lin(3, 6), {"type": "layernorm", "dim": 6}, {"type": "tanh"}, lin(6, 2)]
    case = float_case(model, 4, 3, 2)
    # Non-trivial affine parameters, so their gradients and use both show.
    rng = np.random.default_rng(1)
    case.init_sd["1.weight"] = rng.uniform(0.5, 1.5, 6).astype(np.float32)
    case.init_sd["1.bias"] = rng.uniform(-0.5, 0.5, 6).astype(np.float32)
    check(case, work)


@pytest.mark.parametrize("T,dim,heads,causal", [(5, 6, 2, True), (5, 6, 3, False), (1, 4, 2, True), (3, 5, 1, True)])
def test_attention(work, T, dim, heads, causal):
    model = [lin(3, dim), {"type": "attention", "dim": dim, "heads": heads, "causal": causal}, lin(dim, 2)]
    check(float_case(model, T, 3, 2, seed=T * 10 + heads), work)


def test_gelu_tanh_and_nested_residuals(work):
    model = [lin(3, 6),
             {"type": "residual", "layers": [
                 {"type": "layernorm", "dim": 6},
                 {"type": "residual", "layers": [lin(6, 6), {"type": "gelu", "approximate": "tanh"}]},
                 lin(6, 6)]},
             {"type": "gelu", "approximate": "tanh"}, lin(6, 2)]
    check(float_case(model, 3, 3, 2, seed=5), work)


def gpt(vocab=32, T=8, dim=16, heads=2, blocks=2, attn_bias=True, p=0.0, tie=False):
    """nanoGPT's GPT in ddpd's layers; `tie`: its head without bias, tied to the embedding
    (nanoGPT's lm_head.weight = wte.weight)."""
    model = [{"type": "embedding", "num": vocab, "dim": dim}, {"type": "position", "max": T, "dim": dim}]
    for _ in range(blocks):
        model.append({"type": "residual", "layers": [{"type": "layernorm", "dim": dim},
                                                     {"type": "attention", "dim": dim, "heads": heads,
                                                      "bias": attn_bias}]})
        model.append({"type": "residual", "layers": [{"type": "layernorm", "dim": dim}, lin(dim, 4 * dim),
                                                     {"type": "gelu", "approximate": "tanh"}, lin(4 * dim, dim),
                                                     {"type": "dropout", "p": p}]})
    model += [{"type": "layernorm", "dim": dim}, dict(lin(dim, vocab, bias=False), tie="0") if tie else lin(dim, vocab)]
    return model


def token_case(model, vocab, T, n, world, opt, batch_size, grad_accum=1, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, vocab, size=(n, T)).astype(np.int32)
    y = rng.integers(0, vocab, size=(n, T)).astype(np.int32)
    spec = spec_of(model, [T], "cross_entropy", opt, batch_size, grad_accum)
    return H.Case.sharded(spec, world, x, y, torch_models.init_state(model, seed))


def test_embedding_position_sequence_ce(work):
    model = [{"type": "embedding", "num": 7, "dim": 6}, {"type": "position", "max": 5, "dim": 6}, lin(6, 7)]
    check(token_case(model, 7, 4, 9, 1, {"type": "sgd", "lr": 0.5}, 2, seed=3), work)


OPTS = {"sgd-momentum": {"type": "sgd", "lr": 0.1, "momentum": 0.9},
        "adamw": {"type": "adamw", "lr": 0.002, "weight_decay": 0.1}}


@pytest.mark.parametrize("opt", sorted(OPTS))
@pytest.mark.parametrize("world", [1, 2, 3])
def test_gpt_ddp(work, world, opt):
    """A 2-block GPT, batches of 2, grad_accum 2. W = 1: one file of 10 samples (5 batches, a
    leftover step of one). W = 2, 3: per-rank files of 12, 8 (and 4) samples, so ranks run
    3, 2 (and 1) steps and join (a whole number of steps each, so PyTorch's own collectives
    stay matched). AdamW divides each gradient by its own running size, so where a true
    gradient is about zero it turns both sides' float noise (gradients here agree with
    PyTorch's to ~1e-8) into steps of up to lr: hence a small lr, and attention without
    biases (the key bias's true gradient is exactly zero: softmax ignores a shift shared by
    a query's scores); the SGD cases keep them."""
    model = gpt(attn_bias=opt != "adamw")
    sizes = {1: [10], 2: [12, 8], 3: [12, 8, 4]}[world]
    case = token_case(model, 32, 8, sum(sizes), 1, OPTS[opt], 2, grad_accum=2, seed=7 + world)
    x, y = case.full
    if world > 1:
        cuts = np.cumsum([0] + sizes)
        case = H.Case.per_rank(case.spec, [x[a:b] for a, b in zip(cuts, cuts[1:])],
                               [y[a:b] for a, b in zip(cuts, cuts[1:])], case.init_sd)
    run = check(case, work)
    assert bool(run.of("join")) == (world > 1), "ranks with fewer steps join"


def token_streams(vocab, T, sizes, tails, seed):
    """Per rank, a stream of ids holding sizes[r] windows of T (n·T + 1 ids) and tails[r]
    ids more that no window reaches; and its windows as x and y, as the tokens reader
    takes them (x = ids[i·T : i·T+T], y = ids[i·T+1 : i·T+T+1])."""
    rng = np.random.default_rng(seed)
    streams = [rng.integers(0, vocab, size=n * T + 1 + t).astype(np.uint16) for n, t in zip(sizes, tails)]
    xs = [np.stack([s[i * T:i * T + T] for i in range(n)]).astype(np.int32) for s, n in zip(streams, sizes)]
    ys = [np.stack([s[i * T + 1:i * T + T + 1] for i in range(n)]).astype(np.int32)
          for s, n in zip(streams, sizes)]
    return streams, xs, ys


def tokens_files(streams, T, name="tok"):
    """Writes each rank's stream as NAME_<rank>.bin; returns a writer for check's `data`."""
    def write(data_dir):
        for r, s in enumerate(streams):
            s.tofile(data_dir / f"{name}_{r}.bin")
        return {"type": "tokens", "path": name + "_{rank}.bin", "block_size": T, "shuffle": False}
    return write


@pytest.mark.parametrize("sizes,tails", [([6, 6], [0, 3]), ([12, 8], [5, 0])], ids=["even", "uneven-join"])
def test_gpt_tokens_file_per_rank(work, sizes, tails):
    """issue 28: `tokens` with {rank}: each rank reads its own file whole, sharded no
    further: its windows in order, ids past the last window unused. Against PyTorch DDP
    fed the same windows per rank. Uneven files (12 and 8 windows, batches of 2,
    grad_accum 2: 3 and 2 steps) run with join, as with per-rank .npy files."""
    model = gpt(attn_bias=True)
    streams, xs, ys = token_streams(32, 8, sizes, tails, seed=11)
    spec = spec_of(model, [8], "cross_entropy", OPTS["sgd-momentum"], 2, grad_accum=2)
    case = H.Case.per_rank(spec, xs, ys, torch_models.init_state(model, 11))
    run = check(case, work, data=tokens_files(streams, 8))
    assert bool(run.of("join")) == (sizes[0] != sizes[1]), "the rank with fewer windows joins"
    assert [e["batches"] for e in sorted(run.of("start"), key=lambda e: e["rank"])] == [n // 2 for n in sizes]


def test_gpt_tokens_file_per_rank_resume_is_exact(work):
    """A checkpoint of a job on per-rank tokens files of different lengths (shuffled, join,
    2 epochs) resumes into exactly the uninterrupted run: each rank's position in its own
    file is restored."""
    resume_on_rank_files(work, gpt(), seed=4)


def resume_on_rank_files(work, model, seed):
    """`model` on per-rank tokens files of 10 and 6 windows (shuffled, join, 2 epochs, AdamW,
    grad_accum 2), uninterrupted and resumed from ckpt-4: the same losses and final weights,
    bit for bit. Returns the resumed run."""
    H.need_bin()
    streams, xs, ys = token_streams(32, 8, [10, 6], [1, 0], seed=seed)
    case = H.Case.per_rank(spec_of(model, [8], "cross_entropy", {"type": "adamw", "lr": 0.01}, 2, grad_accum=2),
                           xs, ys, torch_models.init_state(model, seed))
    spec = case.write(Path(work) / "data")
    spec["data"] = dict(tokens_files(streams, 8)(Path(work) / "data"), shuffle=True, seed=3)
    spec["epochs"] = 2
    spec["checkpoint"] = {"every_steps": 2, "keep_last": 100}
    full = H.run_ddpd(spec, 2, work, name="full").check_ok(2)
    assert full.of("join"), "rank 1 (3 batches) joins"
    res = H.run_ddpd(spec, 2, work, name="resumed", extra=["--resume", str(full.out / "ckpt-4")]).check_ok(2)
    want, got = full.losses(), res.losses()
    for r in range(2):
        later = {s: v for s, v in want[r].items() if s > 4}
        assert later and got[r] == later, f"rank {r}: resumed {got[r]} vs straight {later}"
    a, b = full.model(), res.model()
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a), "final weights differ"
    return res


@pytest.mark.parametrize("world,opt", [(1, "adamw"), (2, "sgd-momentum"), (3, "adamw")])
def test_gpt_wide_rows(work, world, opt):
    """Rows longer than a warp: dim 48, T 40 keys, vocab 70, so every lane of the CUDA
    kernels' warp-per-row reductions (LayerNorm, softmax, cross_entropy) takes a second pass,
    which the small GPT above never reaches. One block, per-rank files of 6, 4 (and 2)
    sequences: ranks join."""
    model = gpt(vocab=70, T=40, dim=48, heads=3, blocks=1, attn_bias=opt != "adamw")
    sizes = [6, 4, 2][:world]
    case = token_case(model, 70, 40, sum(sizes), 1, OPTS[opt], 2, seed=3 + world)
    x, y = case.full
    cuts = np.cumsum([0] + sizes)
    case = H.Case.per_rank(case.spec, [x[a:b] for a, b in zip(cuts, cuts[1:])],
                           [y[a:b] for a, b in zip(cuts, cuts[1:])], case.init_sd)
    check(case, work)


def test_gpt_dropout_resume_is_exact(work):
    H.need_bin()
    model = gpt(p=0.2)
    case = token_case(model, 32, 8, 24, 2, {"type": "adamw", "lr": 0.01}, 2, grad_accum=2, seed=5)
    spec = case.write(Path(work) / "data")
    spec["epochs"] = 2
    spec["checkpoint"] = {"every_steps": 2, "keep_last": 100}
    full = H.run_ddpd(spec, 2, work, name="full").check_ok(2)
    res = H.run_ddpd(spec, 2, work, name="resumed", extra=["--resume", str(full.out / "ckpt-4")]).check_ok(2)
    want, got = full.losses(), res.losses()
    for r in range(2):
        later = {s: v for s, v in want[r].items() if s > 4}
        assert later and got[r] == later, f"rank {r}: resumed {got[r]} vs straight {later}"
    a, b = full.model(), res.model()
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a), "final weights differ"
    # the masks are live: the same job without dropout ends elsewhere
    spec0 = dict(spec, model=gpt(p=0.0))
    spec0.pop("checkpoint")
    plain = H.run_ddpd(spec0, 2, work, name="plain").check_ok(2)
    assert plain.losses()[0] != want[0], "dropout p=0.2 changed nothing"


def test_gpt_eval_per_position(work):
    """eval (§2a) of a GPT: loss and accuracy per position over B·T, against PyTorch on the
    final weights (eval runs after the last step with the model that step left)."""
    H.need_bin()
    H.need_torch()
    import torch
    model = gpt(p=0.3)  # eval turns dropout off
    case = token_case(model, 32, 8, 10, 1, {"type": "adamw", "lr": 0.002}, 2, seed=21)
    spec = case.write(Path(work) / "data")
    spec["eval"] = {"data": {"type": "npy", "x": "x.npy", "y": "y.npy", "shuffle": False}, "every_steps": 1000}
    run = H.run_ddpd(spec, 1, work).check_ok(1)
    ev = run.of("eval", 0)
    assert len(ev) == 1, f"one eval, after the last step: {ev}"
    tree = torch_models.build(model)
    tree.load_state_dict({k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in run.model().items()})
    tree.eval()
    x, y = case.full
    with torch.no_grad():
        out = tree(torch.from_numpy(x.astype(np.int64)))
        yy = torch.from_numpy(y.astype(np.int64))
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, 32), yy.reshape(-1)).item()
        acc = (out.argmax(-1) == yy).float().mean().item()
    assert ev[0]["samples"] == 10
    assert ev[0]["loss"] == pytest.approx(loss, rel=1e-5, abs=1e-7), (ev[0], loss)
    assert ev[0]["accuracy"] == pytest.approx(acc, abs=1e-9), (ev[0], acc)


def test_gpt_init_from_missing_nested_tensor(work):
    """init.from without one of the nested tensors: refused before training, naming it."""
    H.need_bin()
    case = token_case(gpt(), 32, 8, 4, 1, {"type": "sgd", "lr": 0.1}, 2, seed=1)
    del case.init_sd["4.1.qkv.weight"]
    spec = case.write(Path(work) / "data")
    run = H.run_ddpd(spec, 1, work)
    assert run.rc != 0, run.describe()
    text = run.stdout + run.stderr
    assert 'no tensor "4.1.qkv.weight"' in text and "qkv.weight [48, 16] of layer 4.1" in text, run.describe()
