"""test_conv.py — the conv-net layers (CONTRACT.md §2a: conv2d, maxpool2d, avgpool2d,
batchnorm, flatten) through `ddpd run` against PyTorch 1.13 on the same module tree
(pylib.torch_models), from the same init.from weights on the same data.

Per layer (one rank, SGD, a few steps: the losses check the forward, the weights after each
update the backward, the buffers BatchNorm's running statistics): conv2d with odd sizes and
stride/padding combinations, both pools with stride and padding, batchnorm 1d and 2d, flatten;
BatchNorm1d on a batch of one row is refused before training (by the planner, or for {rank}
files by the rank at its start), naming the layer, as PyTorch raises it; BatchNorm2d follows
PyTorch's rule (N·H·W values per channel).
End to end: a conv net with BatchNorm on 2 ranks with grad_accum 2 and uneven data (join)
against PyTorch DDP (gloo, broadcast_buffers=True): losses, final weights and buffers
(num_batches_tracked exact), and ddpd's model.safetensors loads into the PyTorch tree with
load_state_dict(strict=True). Tolerances are the existing parity tests'."""
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
    return H.workdir("conv-parity-") if H.os.environ.get("DDPD_TEST_TMP") else tmp_path


def spec_of(model, input_shape, optimizer, batch_size, grad_accum=1):
    return {"name": "conv-parity", "device": "cpu", "model": model, "input_shape": input_shape,
            "loss": "cross_entropy", "optimizer": optimizer, "batch_size": batch_size, "epochs": 1,
            "grad_accum": grad_accum, "log_every": 1}


def check(case, work):
    """Runs the case on both sides; asserts losses, final weights and buffers, the strict load."""
    H.need_bin()
    H.need_torch()
    spec = case.write(Path(work) / "data")
    run = H.run_ddpd(spec, case.world, work)
    run.check_ok(case.world)
    ref = H.torch_ddp(case, work)
    got = run.model()
    problems = [m for m in (H.compare_all_losses(run.losses(), ref), H.compare_tensors(got, ref[0]["state"])) if m]
    for k, v in ref[0]["state"].items():
        if k.endswith("num_batches_tracked") and k in got and int(np.asarray(got[k])) != int(v):
            problems.append(f"{k}: {int(np.asarray(got[k]))} vs reference {int(v)}")
    assert not problems, "\n".join(problems) + "\n\n" + run.describe()

    import torch
    tree = torch_models.build(case.spec["model"])
    tree.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in got.items()}, strict=True)
    return run


def image_case(model, shape, classes, n=10, world=1, batch_size=3, grad_accum=1, seed=0, per_rank=None, lr=0.1):
    rng = np.random.default_rng(seed)
    opt = {"type": "sgd", "lr": lr, "momentum": 0.9}
    spec = spec_of(model, list(shape), opt, batch_size, grad_accum)
    init = torch_models.init_state(model, seed)
    # Non-trivial BatchNorm affine parameters, so their gradients and use both show.
    for k in list(init):
        if k.endswith(".weight") and init[k].ndim == 1:
            init[k] = rng.uniform(0.5, 1.5, init[k].shape).astype(np.float32)
    if per_rank:
        xs = [rng.normal(size=(m, *shape)).astype(np.float32) for m in per_rank]
        ys = [rng.integers(0, classes, size=m).astype(np.int64) for m in per_rank]
        return H.Case.per_rank(spec, xs, ys, init)
    x = rng.normal(size=(n, *shape)).astype(np.float32)
    y = rng.integers(0, classes, size=n).astype(np.int64)
    return H.Case.sharded(spec, world, x, y, init)


def conv(i, o, k, s=1, p=0, bias=True):
    return {"type": "conv2d", "in": i, "out": o, "kernel": k, "stride": s, "padding": p, "bias": bias}


@pytest.mark.parametrize("k,s,p,bias", [(3, 1, 0, True), ([3, 2], [2, 1], [1, 0], True), (2, 2, 1, False),
                                        (1, 1, 0, True), (5, 3, 2, True)])
def test_conv2d(work, k, s, p, bias):
    model = [conv(2, 3, k, s, p, bias), {"type": "tanh"}, {"type": "flatten"}]
    # the flattened width from PyTorch itself
    import torch
    out = torch_models.build(model)(torch.zeros(1, 2, 7, 6)).shape[1]
    model.append({"type": "linear", "in": out, "out": 3})
    check(image_case(model, (2, 7, 6), 3, seed=hash((str(k), str(s))) % 100), work)


@pytest.mark.parametrize("pool", ["maxpool2d", "avgpool2d"])
@pytest.mark.parametrize("k,s,p", [(2, None, 0), (3, 2, 1), ([3, 2], [1, 2], [1, 1])])
def test_pool(work, pool, k, s, p):
    layer = {"type": pool, "kernel": k, "padding": p}
    if s is not None:
        layer["stride"] = s
    model = [conv(1, 2, 3, 1, 1), layer, {"type": "flatten"}]
    import torch
    out = torch_models.build(model)(torch.zeros(1, 1, 7, 5)).shape[1]
    model.append({"type": "linear", "in": out, "out": 4})
    check(image_case(model, (1, 7, 5), 4, seed=7), work)


# (2, 16, 12): a batch of 4 holds 768 values per channel, more than the CUDA statistics
# kernel's 512 threads, so each thread sums several
@pytest.mark.parametrize("shape", [(2, 5, 7), (2, 16, 12)], ids=["small", "wide"])
def test_batchnorm2d_and_1d(work, shape):
    flat = 4 * (shape[1] // 2) * (shape[2] // 2)
    model = [conv(2, 4, 3, 1, 1), {"type": "batchnorm", "features": 4}, {"type": "relu"},
             {"type": "maxpool2d", "kernel": 2}, {"type": "flatten"}, {"type": "linear", "in": flat, "out": 5},
             {"type": "batchnorm", "features": 5, "momentum": 0.3, "eps": 1e-3}, {"type": "relu"},
             {"type": "linear", "in": 5, "out": 3}]
    check(image_case(model, shape, 3, n=11, batch_size=4, seed=3), work)


BN1D = [{"type": "linear", "in": 3, "out": 4}, {"type": "batchnorm", "features": 4},
        {"type": "linear", "in": 4, "out": 2}]
TORCH_WORDS = "Expected more than 1 value per channel when training"


def test_batchnorm1d_one_row_is_refused_before_training(work):
    """issue 28: a batch of one row gives BatchNorm1d one value per channel, which PyTorch
    refuses in training. 5 samples in batches of 2: the last batch of every epoch has one
    row. The planner knows the batch sizes: `ddpd run` refuses the job before any rank
    starts, naming the layer, the rank, the batch and data.drop_last (the old code trained
    steps 1 and 2 and failed at step 3); with drop_last it trains and matches PyTorch."""
    H.need_bin()
    case = image_case(BN1D, (3,), 2, n=5, batch_size=2)  # batches of 2, 2 and 1
    spec = case.write(Path(work) / "data")
    run = H.run_ddpd(spec, 1, work)
    assert run.rc == 2, run.describe()
    text = run.describe()
    for w in ("model[1] (batchnorm): rank 0's last batch of every epoch (batch 3 of 3, in step 3 of the epoch) "
              "holds 1 of its 5 samples", "[1, 4]", TORCH_WORDS, "data.drop_last"):
        assert w in text, (w, text)
    assert not run.of("loss") and not run.of("start"), "refused before any rank started"
    case.spec["data"] = {"drop_last": True}
    check(case, work)


def test_batchnorm1d_one_row_in_a_rank_file_ends_that_rank_before_its_first_step(work):
    """{rank} files only the ranks see: rank 1's file of 5 rows (batches of 2, 2, 1) ends
    rank 1 at its start with the same message, not at its third step."""
    H.need_bin()
    case = image_case(BN1D, (3,), 2, batch_size=2, per_rank=[4, 5])
    spec = case.write(Path(work) / "data")
    run = H.run_ddpd(spec, 2, work)
    assert run.rc == 2, run.describe()
    errs = [e["message"] for e in run.of("error", 1)]
    assert any("model[1] (batchnorm): rank 1's last batch of every epoch (batch 3 of 3" in m and TORCH_WORDS in m
               for m in errs), run.describe()
    assert not run.of("loss"), "no rank trained a step"


def test_batchnorm2d_follows_pytorchs_rule(work):
    """BatchNorm2d counts N·H·W values per channel: a last batch of one 3×3 image is fine
    (and matches PyTorch), one of a 1×1 image is refused like BatchNorm1d's."""
    H.need_bin()
    model = [conv(2, 4, 3, 1, 1), {"type": "batchnorm", "features": 4}, {"type": "flatten"},
             {"type": "linear", "in": 36, "out": 3}]
    check(image_case(model, (2, 3, 3), 3, n=5, batch_size=2, seed=2), work)
    model = [conv(2, 4, 3), {"type": "batchnorm", "features": 4}, {"type": "flatten"},
             {"type": "linear", "in": 4, "out": 3}]
    case = image_case(model, (2, 3, 3), 3, n=5, batch_size=2, seed=2)
    run = H.run_ddpd(case.write(Path(work) / "data"), 1, work, name="one-by-one")
    assert run.rc == 2, run.describe()
    assert "model[1] (batchnorm)" in run.stderr and "[1, 4, 1, 1]" in run.stderr and TORCH_WORDS in run.stderr, \
        run.describe()


def cnn():
    return [conv(1, 4, 3, 1, 1), {"type": "batchnorm", "features": 4}, {"type": "relu"},
            {"type": "maxpool2d", "kernel": 2}, conv(4, 6, 3), {"type": "batchnorm", "features": 6},
            {"type": "relu"}, {"type": "flatten"}, {"type": "linear", "in": 6 * 2 * 2, "out": 8},
            {"type": "batchnorm", "features": 8}, {"type": "relu"}, {"type": "linear", "in": 8, "out": 3}]


@pytest.mark.parametrize("epochs", [1, 2])
def test_cnn_ddp_grad_accum_join(work, epochs):
    """W = 2, batches of 3, grad_accum 2: rank 0 has 18 samples (3 steps), rank 1 12 (2 steps).
    The buffers come from the highest live rank: rank 1 while it runs, so rank 0 starts step 2
    with rank 1's running statistics (the first micro-batch of a cycle broadcasts, the synced
    second does not); rank 1 joins after step 2 and receives rank 0's broadcast of step 3;
    the final sync is rank 0's. Rank 0's final buffers show every one of these broadcasts."""
    case = image_case(cnn(), (1, 8, 8), 3, batch_size=3, grad_accum=2, per_rank=[18, 12], seed=11)
    case.spec["epochs"] = epochs  # 2: the flag and the joins carry over into the next epoch
    check(case, work)


def test_cnn_ddp_w3_join(work):
    """W = 3, batches of 3, grad_accum 2: ranks hold 18, 18 and 12 samples (3, 3 and 2 steps). The first micro-batch of step 2
    broadcasts rank 2's running statistics to ranks 0 and 1; step 3's comes from rank 1
    (rank 2 has joined and receives it), whose replica the final sync then sends. ddpd's
    conv sums in im2col order, PyTorch's oneDNN in its own: float noise of ~1e-7 that
    BatchNorm over 3 rows and momentum amplify step by step, hence lr 0.05 here."""
    check(image_case(cnn(), (1, 8, 8), 3, batch_size=3, grad_accum=2, per_rank=[18, 18, 12], seed=13, lr=0.05),
          work)


def test_cnn_ddp_even(work):
    check(image_case(cnn(), (1, 8, 8), 3, n=24, world=2, batch_size=3, seed=12), work)


@pytest.mark.cpu_only("2 epochs of 1,438 images take over 2 minutes on the emulated GPU; the conv, pool and "
                      "BatchNorm cases and the conv-net DDP cases above compute what it computes")
def test_digits_example(work):
    """examples/digits-cnn.json on scikit-learn's digits as examples/digits_data.py exports
    them: the job succeeds and its final eval accuracy is at least 0.95 (a behaviour, not a
    timing)."""
    H.need_bin()
    pytest.importorskip("sklearn")
    import json
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[2]
    data = Path(work) / "data"
    subprocess.run([sys.executable, str(root / "examples" / "digits_data.py"), "--data-dir", str(data)], check=True,
                   capture_output=True, text=True, timeout=120)
    spec = json.loads((root / "examples" / "digits-cnn.json").read_text())
    run = H.run_ddpd(spec, spec["world_size"], work, timeout=300)
    run.check_ok(spec["world_size"])
    evals = run.of("eval", 0)
    assert evals, "no eval events\n" + run.describe()
    last = evals[-1]
    assert last["samples"] == 359, last
    assert last["accuracy"] >= 0.95, f"final eval accuracy {last['accuracy']}\n" + run.describe()


def test_cnn_eval_on_running_statistics(work):
    """Eval events of a BatchNorm conv net on 2 ranks with join (rank 0: 4 steps, rank 1: 2)
    against a PyTorch eval loop (model.eval(): BatchNorm on its running statistics): each
    live rank scores its shard with its own replica (its own running statistics, which
    differ from the other rank's between broadcasts), a joined rank with the replica of the
    highest live rank. Eval runs after steps 2 and 4."""
    torch = H.need_torch()
    H.need_bin()
    case = image_case(cnn(), (1, 8, 8), 3, batch_size=3, per_rank=[12, 6], seed=21)
    case.spec["eval"] = {"data": {"type": "npy", "x": "ex.npy", "y": "ey.npy"}, "every_steps": 2}
    data = Path(work) / "data"
    spec = case.write(data)
    rng = np.random.default_rng(22)
    ex = rng.normal(size=(10, 1, 8, 8)).astype(np.float32)
    ey = rng.integers(0, 3, size=10).astype(np.int64)
    np.save(data / "ex.npy", ex)
    np.save(data / "ey.npy", ey)
    run = H.run_ddpd(spec, 2, work)
    run.check_ok(2)
    ref = H.torch_ddp(case, work)
    problems = [m for m in (H.compare_all_losses(run.losses(), ref), H.compare_tensors(run.model(), ref[0]["state"]))
                if m]
    evals = run.of("eval", 0)
    if [int(e["step"]) for e in evals] != [2, 4]:
        problems.append(f"eval steps {[e['step'] for e in evals]}, want [2, 4]")
    for e in evals:
        st = int(e["step"])
        owner = max(r for r in range(2) if st in ref[r]["snapshots"])
        total, correct, n = 0.0, 0, 0
        for r in range(2):
            snap = ref[r]["snapshots"][st] if st in ref[r]["snapshots"] else ref[owner]["snapshots"][st]
            m = torch_models.build(case.spec["model"])
            m.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in snap.items()})
            m.eval()
            x, y = ex[r::2], ey[r::2]
            with torch.no_grad():
                for b in range(0, len(x), 3):
                    out = m(torch.from_numpy(x[b:b + 3]))
                    yb = torch.from_numpy(y[b:b + 3])
                    total += float(torch.nn.functional.cross_entropy(out, yb, reduction="sum"))
                    correct += int((out.argmax(dim=1) == yb).sum())
                    n += len(yb)
        if abs(e["loss"] - total / n) > 1e-5 * abs(total / n) + 1e-7:
            problems.append(f"eval at step {st}: loss {e['loss']}, PyTorch {total / n}")
        if e.get("accuracy") != correct / n or e.get("samples") != n:
            problems.append(f"eval at step {st}: {e}, PyTorch accuracy {correct / n}, samples {n}")
    assert not problems, "\n".join(problems) + "\n\n" + run.describe()


def test_cnn_resume_is_exact(work):
    """A BatchNorm conv net on 3 ranks with join ({rank} files of 9, 21 and 15 images ->
    3, 7, 5 batches of 3; 2 epochs, shuffled), resumed from each checkpoint: every rank's
    later losses and the final model.safetensors (buffers included) are bitwise those of
    the straight run, as test_resume.py asserts for MLPs. The checkpoints hold the buffers
    of each replica (model-rank-R inside an epoch)."""
    H.need_bin()
    from test_resume import check_resumes, raw_tensors
    data = Path(work) / "data"
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(31)
    for r, m in enumerate([9, 21, 15]):
        np.save(data / f"x_{r}.npy", rng.normal(size=(m, 1, 8, 8)).astype(np.float32))
        np.save(data / f"y_{r}.npy", rng.integers(0, 3, size=m).astype(np.int64))
    spec = spec_of(cnn(), [1, 8, 8], {"type": "sgd", "lr": 0.05, "momentum": 0.9}, 3)
    spec.update({"epochs": 2, "world_size": 3, "checkpoint": {"every_steps": 3, "keep_last": 1000},
                 "init": {"seed": 3}, "data": {"type": "npy", "x": "x_{rank}.npy", "y": "y_{rank}.npy", "seed": 5}})
    check_resumes(work, spec, 3)
    t, _ = raw_tensors(Path(work) / "full" / "ckpt-3" / "model.safetensors")
    assert {"1.running_mean", "1.running_var", "1.num_batches_tracked"} <= set(t), sorted(t)
    assert len(t["1.num_batches_tracked"]) == 8


def test_init_from_without_buffers_is_refused(work):
    """An init.from file with every parameter but not BatchNorm's buffers is refused, naming
    the missing buffer (load_state_dict(strict=True) refuses it too)."""
    H.need_bin()
    model = [{"type": "linear", "in": 3, "out": 4}, {"type": "batchnorm", "features": 4},
             {"type": "linear", "in": 4, "out": 2}]
    case = image_case(model, (3,), 2, n=6, batch_size=3)
    for k in [k for k in case.init_sd if "running" in k or "num_batches" in k]:
        del case.init_sd[k]
    spec = case.write(Path(work) / "data")
    run = H.run_ddpd(spec, 1, work)
    assert run.rc != 0, run.describe()
    assert '"1.running_mean"' in run.describe(), run.describe()
