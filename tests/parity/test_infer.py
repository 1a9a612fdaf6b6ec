"""test_infer.py — inference from a trained job's model (issue 29) against PyTorch 1.13:
models trained with `ddpd run`, then `ddpd-worker --infer` driven over its pipes
(pylib.infer; docs/generation.md "The worker's protocol"), and the same weights loaded
strictly into the spec's PyTorch tree (pylib.torch_models) in eval mode.

(a) Greedy generation from a char GPT (byte vocabulary, dropout in training) equals
nanoGPT-style argmax decoding token for token, for prompts of 1 token, of the full window
and longer than it (cropped, and generating past the window), for a 1-rank job, a
world_size 2 job, a job resumed from a checkpoint and a checkpoint's own model; its text is
the ids' UTF-8 with replacement, and the stream's texts add up to it.
(b) predict equals PyTorch's eval-mode forward within 1e-5 (+ 1e-5 relative) for an MLP,
the digits conv net with BatchNorm on its running statistics (inputs as JSON, as an .npy
file larger than one batch, and the first eval samples with their labels) and a GPT; the top
classes are PyTorch's softmax.
(c) A seeded sample is reproducible; 2,000 draws (seeds 0..1999, one new token each, at
temperature 1 with top_k 5) follow the softmax PyTorch computes from the same weights (a
chi-square test of 4 degrees of freedom at alpha 0.001, which rejects the wrong samplers'
distributions: uniform over the five, the wrong temperature, top-4), and each draw is the
token docs/generation.md's rule gives from PyTorch's logits.
(d) Errors name their field: ids outside the vocabulary, a sample of the wrong shape,
generate on an MLP, a request before load, lines that are not requests, a line over the
cap, max_new_tokens over the cap; a cancel mid-generation ends it with cancelled true;
a cancel with nothing running is ignored.
On the emulated GPU (parity_emu.test_infer) the models are trained and loaded with
"device": "cuda"; the sampler, the text and the protocol's errors are host code and run
on the CPU only."""
import json
from pathlib import Path

import numpy as np
import pytest

from pylib import ddp as H
from pylib import infer as I
from pylib.common import device_spec
from pylib.parity import make_xy

T = 8
CORPUS = ("the cat sat on the mat. the dog ate the hat. " "café au lait, crème brûlée! " "naïve tête-à-tête. ") * 30
TOL = 1e-5


def lin(i, o):
    return {"type": "linear", "in": i, "out": o}


def gpt_model(vocab=256, dim=32, heads=4, blocks=2):
    m = [{"type": "embedding", "num": vocab, "dim": dim}, {"type": "position", "max": T, "dim": dim},
         {"type": "dropout", "p": 0.1}]
    for _ in range(blocks):
        m.append({"type": "residual", "layers": [{"type": "layernorm", "dim": dim},
                                                 {"type": "attention", "dim": dim, "heads": heads}]})
        m.append({"type": "residual", "layers": [{"type": "layernorm", "dim": dim}, lin(dim, 4 * dim),
                                                 {"type": "gelu", "approximate": "tanh"}, lin(4 * dim, dim),
                                                 {"type": "dropout", "p": 0.1}]})
    return m + [{"type": "layernorm", "dim": dim}, lin(dim, vocab)]


def char_data(data):
    """x, y: windows of T bytes of the corpus and the bytes after them (stride 3)."""
    b = np.frombuffer(CORPUS.encode(), dtype=np.uint8).astype(np.int32)
    starts = range(0, len(b) - T - 1, 3)
    x = np.stack([b[s:s + T] for s in starts])
    y = np.stack([b[s + 1:s + T + 1] for s in starts])
    data.mkdir(parents=True, exist_ok=True)
    np.save(data / "x.npy", x)
    np.save(data / "y.npy", y)
    return x, y


def gpt_spec(steps=40, world=1, **extra):
    return dict({"name": "char-gpt", "device": "cpu", "world_size": world, "input_shape": [T], "model": gpt_model(),
                 "loss": "cross_entropy", "optimizer": {"type": "adamw", "lr": 0.01}, "batch_size": 16,
                 "steps": steps, "log_every": 10, "init": {"seed": 5},
                 "data": {"type": "npy", "x": "x.npy", "y": "y.npy", "seed": 3}}, **extra)


def train(work, spec, name="run", world=1, extra=()):
    run = H.run_ddpd(spec, world, work, name=name, extra=extra, timeout=300)
    run.check_ok(world)
    return run


@pytest.fixture
def worker(work):
    w = I.Worker(log=Path(work) / "infer.log")
    yield w
    assert w.close() == 0, "ddpd-worker --infer did not exit 0 at EOF: " + w.stderr()


@pytest.fixture(scope="module")
def char_job(tmp_path_factory):
    """A 1-rank char GPT (trained once for the module): (work folder, spec as run, weights)."""
    H.need_bin()
    H.need_torch()
    work = tmp_path_factory.mktemp("infer-gpt")
    char_data(work / "data")
    spec = gpt_spec()
    run = train(work, spec)
    return work, device_spec(spec), run.out / "model.safetensors"


# ---------------------------------------------------------------------------------------
# (a) greedy generation against PyTorch's argmax decoding

PROMPTS = {"one": CORPUS[:1], "window": CORPUS[:T], "longer": CORPUS[5:5 + 3 * T + 1]}


def check_greedy(worker, spec, weights):
    model = I.torch_model(spec["model"], weights)
    ans = worker.load(spec, weights)
    assert ans["generate"] is True and ans["block_size"] == T and ans["vocab"] == 256 and ans["bytes_vocab"], ans
    n = 2 * T + 4  # past the window: every token after the first T recomputes a cropped window
    for name, prompt in PROMPTS.items():
        ids = list(prompt.encode())
        want = I.greedy(model, ids, n, T)
        stream, got = worker.ok({"op": "generate", "prompt": prompt, "max_new_tokens": n, "temperature": 0,
                                 "stream": True})
        assert got["ids"] == want, f"prompt {name!r}: ddpd {got['ids']} vs PyTorch {want}"
        assert got["prompt_tokens"] == len(ids) and got["cropped"] == max(0, len(ids) - T), got
        assert got["text"] == bytes(got["ids"]).decode("utf-8", "replace"), got
        assert [s["token"] for s in stream] == got["ids"], stream
        assert "".join(s["text"] for s in stream) == got["text"], stream
        # The same prompt as ids gives the same tokens.
        assert worker.ok({"op": "generate", "ids": ids, "max_new_tokens": n, "temperature": 0})[1]["ids"] == want


def test_greedy_equals_pytorch(char_job, worker):
    work, spec, weights = char_job
    check_greedy(worker, spec, weights)


def test_greedy_world_size_2(work, worker):
    H.need_bin()
    H.need_torch()
    char_data(Path(work) / "data")
    spec = gpt_spec(steps=20, world=2)
    run = train(work, spec, world=2)
    check_greedy(worker, device_spec(spec, 2), run.out / "model.safetensors")


def test_greedy_resumed_job_and_a_checkpoint(work, worker):
    """A job resumed from its step-10 checkpoint, and that checkpoint's own model."""
    H.need_bin()
    H.need_torch()
    char_data(Path(work) / "data")
    spec = gpt_spec(steps=30, checkpoint={"every_steps": 10, "keep_last": 5})
    first = train(work, spec, name="first")
    resumed = train(work, spec, name="resumed", extra=["--resume", str(first.out / "ckpt-10")])
    assert min(int(e["step"]) for e in resumed.of("loss")) > 10, "the resumed run starts after step 10"
    check_greedy(worker, device_spec(spec), resumed.out / "model.safetensors")
    check_greedy(worker, device_spec(spec), first.out / "ckpt-20" / "model.safetensors")


# ---------------------------------------------------------------------------------------
# (b) predict against PyTorch's eval-mode forward


def close(got, want, what):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    err = np.abs(got - want) - (TOL + TOL * np.abs(want))
    i = np.unravel_index(int(np.argmax(err)), err.shape)
    assert err.max() <= 0, f"{what}: worst at {i}: ddpd {got[i]!r} vs PyTorch {want[i]!r}"


def torch_out(model, x, ids=False):
    import torch
    with torch.no_grad():
        t = torch.from_numpy(np.asarray(x, dtype=np.int64 if ids else np.float32))
        return model(t).numpy()


def check_top(top, out):
    """predict's top: PyTorch's softmax, five most likely, ties by lower class."""
    import torch
    p = torch.softmax(torch.from_numpy(np.asarray(out, dtype=np.float64)), dim=-1).numpy()
    for i, t in enumerate(top):
        order = sorted(range(p.shape[1]), key=lambda c: (-p[i, c], c))[:5]
        assert [e["class"] for e in t] == order, (i, t, order)
        # The outputs agree within 1e-5 (float32 sums in another order): so do the p.
        assert all(abs(e["p"] - p[i, e["class"]]) <= 1e-5 for e in t), (i, t)


def test_predict_mlp(work, worker):
    H.need_bin()
    H.need_torch()
    data = Path(work) / "data"
    data.mkdir(parents=True)
    x, y = make_xy(60, 5, 4, "cross_entropy", seed=3)
    np.save(data / "x.npy", x)
    np.save(data / "y.npy", y)
    spec = {"name": "mlp", "device": "cpu", "model": H.mlp(5, 16, 4, act="tanh"), "loss": "cross_entropy",
            "optimizer": {"type": "sgd", "lr": 0.1}, "batch_size": 8, "epochs": 2,
            "data": {"type": "npy", "x": "x.npy", "y": "y.npy"}}
    run = train(work, spec)
    weights = run.out / "model.safetensors"
    model = I.torch_model(spec["model"], weights)
    ans = worker.load(device_spec(spec), weights)
    assert ans["generate"] is False and "starts with linear" in ans["why_not"] and ans["vocab"] is None, ans
    _, got = worker.ok({"op": "predict", "inputs": x[:7].tolist()})
    assert got["shape"] == [4]
    want = torch_out(model, x[:7])
    close(got["outputs"], want, "mlp outputs")
    check_top(got["top"], want)
    np.save(Path(work) / "in.npy", x.astype(np.float64))  # float64 is read as float32, as training reads x
    _, got = worker.ok({"op": "predict", "npy": str(Path(work) / "in.npy")})
    close(got["outputs"], torch_out(model, x), "mlp outputs from .npy")


def digits_spec():
    spec = json.loads((Path(__file__).resolve().parents[2] / "examples" / "digits-cnn.json").read_text())
    spec.update(world_size=1, epochs=1, batch_size=16, log_every=10)
    spec["eval"] = {"data": {"type": "npy", "x": "digits/eval_x.npy", "y": "digits/eval_y.npy"}, "every_steps": 100}
    return spec


def test_predict_digits_cnn_batchnorm(work, worker):
    """The digits conv net after an epoch on random images: BatchNorm's running statistics
    are far from their initial 0 and 1, so eval mode shows; 300 samples from an .npy file
    run in batches of 64."""
    H.need_bin()
    H.need_torch()
    data = Path(work) / "data" / "digits"  # the example's folder in the data directory
    data.mkdir(parents=True)
    rng = np.random.default_rng(8)
    x = (rng.normal(size=(160, 1, 8, 8)) * 2 + 1).astype(np.float32)
    y = rng.integers(0, 10, size=160).astype(np.int64)
    ex = (rng.normal(size=(300, 1, 8, 8)) * 2 + 1).astype(np.float32)
    ey = rng.integers(0, 10, size=300).astype(np.int64)
    for k, v in (("x", x), ("y", y), ("eval_x", ex), ("eval_y", ey)):
        np.save(data / f"{k}.npy", v)
    spec = digits_spec()
    run = train(work, spec)
    weights = run.out / "model.safetensors"
    model = I.torch_model(spec["model"], weights)
    rm = dict(model.named_buffers())["1.running_mean"].numpy()
    assert np.abs(rm).max() > 0.05, "the running statistics moved"
    worker.load(device_spec(spec), weights)
    _, got = worker.ok({"op": "predict", "inputs": ex[:5].tolist()})
    assert got["shape"] == [10]
    want = torch_out(model, ex[:5])
    close(got["outputs"], want, "digits outputs")
    check_top(got["top"], want)
    np.save(Path(work) / "ex.npy", ex)
    _, got = worker.ok({"op": "predict", "npy": str(Path(work) / "ex.npy")})
    close(got["outputs"], torch_out(model, ex), "digits outputs from .npy (5 batches)")
    _, got = worker.ok({"op": "predict", "eval": {"count": 9, "data_dir": str(data.parent)}})
    close(got["outputs"], torch_out(model, ex[:9]), "digits eval samples")
    assert got["labels"] == ey[:9].tolist(), got["labels"]


def test_predict_gpt(char_job, worker):
    work, spec, weights = char_job
    model = I.torch_model(spec["model"], weights)
    worker.load(spec, weights, max_batch=2)
    x = np.load(Path(work) / "data" / "x.npy")[:5]
    _, got = worker.ok({"op": "predict", "inputs": x.tolist()})
    assert got["shape"] == [T, 256] and "top" not in got, {k: v for k, v in got.items() if k != "outputs"}
    close(got["outputs"], torch_out(model, x, ids=True), "gpt outputs")


# ---------------------------------------------------------------------------------------
# (c) the sampler

CHI2_DF4_ALPHA_0001 = 18.467


def chi2(counts, p):
    n = sum(counts)
    return sum((c - n * q) ** 2 / (n * q) for c, q in zip(counts, p))


def top5(logits, temperature=1.0, k=5):
    l = np.asarray(logits, dtype=np.float64)
    ids = sorted(range(len(l)), key=lambda i: (-l[i], i))[:k]
    w = np.exp((l[ids] - l[ids].max()) / temperature)
    return ids, w / w.sum()


@pytest.mark.cpu_only("the sampler and its draw are host code")
def test_seeded_samples_are_reproducible_and_follow_the_softmax(char_job, worker):
    work, spec, weights = char_job
    model = I.torch_model(spec["model"], weights)
    worker.load(spec, weights)
    # Reproducible: the same request, the same tokens; another seed, other tokens.
    req = {"op": "generate", "prompt": "the ", "max_new_tokens": 40, "temperature": 1.0, "top_k": 5, "seed": 77}
    a, b = worker.ok(req)[1], worker.ok(req)[1]
    assert a["ids"] == b["ids"] and a["text"] == b["text"] and a["seed"] == 77
    assert worker.ok(dict(req, seed=78))[1]["ids"] != a["ids"]

    # The prompt whose five most likely tokens tell the wrong samplers apart best.
    cands = ["the ", "t", "a", "cr", "the cat sat"]
    wrong = {
        "uniform over the five": lambda lg: np.full(5, 0.2),
        "temperature 2": lambda lg: top5(lg, 2.0)[1],
        "temperature 0.5": lambda lg: top5(lg, 0.5)[1],
        "top-4": lambda lg: np.append(top5(lg, 1.0, 4)[1], 1e-9),
    }
    n = 2000

    def power(prompt):
        lg = I.last_logits(model, list(prompt.encode()), T)
        p = top5(lg)[1]
        return min(n * sum((p - q) ** 2 / q) for q in (f(lg) for f in wrong.values())), lg

    prompt, (least, logits) = max(((c, power(c)) for c in cands), key=lambda t: t[1][0])
    assert least > 3 * CHI2_DF4_ALPHA_0001, f"no prompt separates the wrong distributions ({least:.1f})"
    ids, p = top5(logits)
    counts = {i: 0 for i in ids}
    off = []
    for lo in range(0, n, 100):
        for s in range(lo, lo + 100):
            worker.send({"op": "generate", "prompt": prompt, "max_new_tokens": 1, "temperature": 1, "top_k": 5,
                         "seed": s})
        for s in range(lo, lo + 100):
            tok = worker.final()[1]["ids"][0]
            assert tok in counts, f"seed {s}: token {tok} is not among the five most likely {ids}"
            counts[tok] += 1
            want, margin = I.sample(logits, 1.0, 5, s, 0)
            if tok != want and margin > 1e-5:
                off.append((s, tok, want, margin))
    assert not off, f"draws that differ from docs/generation.md's rule on PyTorch's logits: {off[:5]}"
    obs = [counts[i] for i in ids]
    stat = chi2(obs, p)
    assert stat < CHI2_DF4_ALPHA_0001, f"prompt {prompt!r}: counts {obs} vs softmax {list(p)}: chi2 {stat:.2f}"
    for name, f in wrong.items():
        q = f(logits)
        assert chi2(obs, q) > CHI2_DF4_ALPHA_0001, f"{name}: chi2 {chi2(obs, q):.2f} would pass: {obs} vs {list(q)}"


# ---------------------------------------------------------------------------------------
# (d) errors, cancel, caps


def err_of(worker, req):
    _, o = worker.request(req)
    assert o["ok"] is False and set(o["error"]) == {"code", "path", "message"}, o
    return o["error"]


@pytest.mark.cpu_only("the protocol's checks are host code")
def test_errors_name_their_field(char_job, worker, work):
    cwork, spec, weights = char_job
    e = err_of(worker, {"op": "generate", "prompt": "x"})
    assert e["code"] == "conflict" and "no model loaded" in e["message"], e
    e = err_of(worker, {"op": "predict", "inputs": [[1]]})
    assert e["code"] == "conflict", e
    # Lines that are not requests: each answered, the worker goes on.
    worker.send(b"this is not json\n")
    e = worker.final()[1]["error"]
    assert e["code"] == "bad_json", e
    for line, path in ((b"[1, 2]\n", ""), (b'{"no": "op"}\n', "op"), (b'{"op": "fly"}\n', "op")):
        worker.send(line)
        o = worker.final()[1]
        assert o["ok"] is False and o["error"]["path"] == path, (line, o)
    worker.send(b'{"op": "load", "spec": ' + b" " * (64 << 20) + b"}\n")
    e = worker.final()[1]["error"]
    assert e["code"] == "too_large", e
    # Load errors name their field.
    e = err_of(worker, {"op": "load", "spec": dict(spec, batch_size=0), "weights": str(weights)})
    assert e["code"] == "invalid_spec" and e["path"] == "spec.batch_size", e
    e = err_of(worker, {"op": "load", "spec": spec, "weights": str(Path(work) / "missing.safetensors")})
    assert e["path"] == "weights" and "missing.safetensors" in e["message"], e

    worker.load(spec, weights)
    e = err_of(worker, {"op": "generate", "ids": [1, 2, 256, 3]})
    assert (e["code"], e["path"]) == ("invalid_spec", "ids[2]") and "256" in e["message"], e
    e = err_of(worker, {"op": "generate", "ids": [1, -1]})
    assert e["path"] == "ids[1]", e
    e = err_of(worker, {"op": "generate", "ids": [1, "a"]})
    assert e["path"] == "ids[1]", e
    e = err_of(worker, {"op": "generate", "prompt": ""})
    assert e["path"] == "prompt" and "at least one" in e["message"], e
    e = err_of(worker, {"op": "generate", "prompt": "x", "max_new_tokens": 10 ** 9})
    assert e["path"] == "max_new_tokens" and "4096" in e["message"], e
    e = err_of(worker, {"op": "generate", "prompt": "x", "temperature": -1})
    assert e["path"] == "temperature", e
    e = err_of(worker, {"op": "generate", "prompt": "x", "top_k": 1.5})
    assert e["path"] == "top_k", e
    x = np.load(Path(cwork) / "data" / "x.npy")[:3].tolist()
    x[2] = x[2][:T - 1]
    e = err_of(worker, {"op": "predict", "inputs": x})
    assert e["path"] == "inputs[2]" and f"[{T - 1}]" in e["message"] and f"[{T}]" in e["message"], e
    e = err_of(worker, {"op": "predict", "inputs": [[1] * (T - 1) + [300]]})
    assert e["path"] == f"inputs[0][{T - 1}]", e
    e = err_of(worker, {"op": "predict", "inputs": [[1] * (T - 1) + ["a"]]})
    assert e["path"] == f"inputs[0][{T - 1}]", e
    # The worker's cap is reachable, and ends the generation there.
    _, o = worker.ok({"op": "generate", "prompt": "a", "max_new_tokens": 4096, "temperature": 0})
    assert len(o["ids"]) == 4096 and o["cancelled"] is False


@pytest.mark.cpu_only("the protocol's checks are host code")
def test_generate_on_an_mlp_is_refused_naming_why(work, worker):
    H.need_bin()
    data = Path(work) / "data"
    data.mkdir(parents=True)
    x, y = make_xy(20, 3, 2, "mse", seed=1)
    np.save(data / "x.npy", x)
    np.save(data / "y.npy", y)
    spec = {"name": "mlp", "device": "cpu", "model": H.mlp(3, 4, 2), "loss": "mse",
            "optimizer": {"type": "sgd", "lr": 0.1}, "batch_size": 4, "epochs": 1,
            "data": {"type": "npy", "x": "x.npy", "y": "y.npy"}}
    run = train(work, spec)
    worker.load(spec, run.out / "model.safetensors")
    e = err_of(worker, {"op": "generate", "ids": [1]})
    assert e["code"] == "invalid_spec" and e["path"] == "model", e
    assert "generate needs a model that starts with embedding" in e["message"] and "starts with linear" in e["message"]
    _, o = worker.ok({"op": "predict", "inputs": x[:2].tolist()})
    assert "top" not in o and o["shape"] == [2]  # mse: raw outputs only


@pytest.mark.cpu_only("cancel is read on the host between tokens")
def test_cancel_mid_generation(char_job, worker):
    _, spec, weights = char_job
    worker.load(spec, weights)
    # A cancel with nothing running is read and ignored: the next answer is unload's.
    worker.send({"op": "cancel"})
    worker.send({"op": "generate", "prompt": "the", "max_new_tokens": 4096, "temperature": 1, "seed": 1,
                 "stream": True})
    first = worker.line()
    assert "token" in first, first
    worker.send({"op": "cancel"})
    stream, o = worker.final()
    assert o["ok"] is True and o["cancelled"] is True, o
    assert len(o["ids"]) == 1 + len(stream) < 4096, (len(o["ids"]), len(stream))
    assert o["ids"] == [first["token"]] + [s["token"] for s in stream]
    assert worker.ok({"op": "unload"})[1] == {"ok": True, "op": "unload"}


def rss(pid):
    for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1]) * 1024
    return 0


@pytest.mark.cpu_only("the worker's host memory")
def test_predict_activations_are_given_back_when_idle(work, worker):
    """A predict's activations (20 MB for 256 digits images) stay for the predicts that
    follow and are given back once the worker has been idle for a second: its resident
    set falls back to what the loaded model holds (a bounded wait, no sleep)."""
    H.need_bin()
    import time
    data = Path(work) / "data"
    data.mkdir(parents=True)
    spec = digits_spec()
    from pylib import torch_models
    from pylib.safetensors import st_save
    st_save(data / "w.safetensors", torch_models.init_state(spec["model"], 4))
    x = np.random.default_rng(1).normal(size=(256, 1, 8, 8)).astype(np.float32)
    np.save(data / "x.npy", x)
    ans = worker.load(spec, data / "w.safetensors", max_batch=256)
    assert ans["activation_bytes"] > 16 << 20, ans
    loaded = rss(worker.p.pid)
    worker.ok({"op": "predict", "npy": str(data / "x.npy")})
    grown = rss(worker.p.pid)
    assert grown - loaded > 16 << 20, (loaded, grown)
    # A sanitizer's allocator keeps freed memory (ASan's quarantine): there the log says it.
    sanitized = "libasan" in Path(f"/proc/{worker.p.pid}/maps").read_text()
    deadline = time.monotonic() + 30
    while "given back" not in worker.stderr() or (not sanitized and rss(worker.p.pid) - loaded > 4 << 20):
        assert time.monotonic() < deadline, f"still {rss(worker.p.pid) - loaded} bytes above the loaded model; " \
            f"log: {worker.stderr()}"
        time.sleep(0.05)
    # And it still answers, allocating them again.
    assert worker.ok({"op": "predict", "inputs": x[:2].tolist()})[1]["shape"] == [10]
