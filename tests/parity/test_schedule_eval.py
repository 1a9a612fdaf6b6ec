"""test_schedule_eval.py — optimizer.schedule, grad_clip and eval (CONTRACT.md §2a) through
`ddpd run --world-size W` (W = 1, 2, 3) against PyTorch 1.13 DDP (gloo) + LambdaLR + clip_grad_norm_.

Compared per step: every rank's loss, the `lr` and `grad_norm` its loss event carries
(lr exact to the double, the norm 1e-5 relative), and the final weights, at the tolerances
of test_ddp.py. Eval events against a PyTorch eval loop over the same shards of the eval
data (each rank's shard: rows r, r+W, …, batches of batch_size, at most max_batches) with
the model of that step: loss 1e-5 relative, accuracy and samples exact. The model of a
step is the replica of the highest rank that ran it itself (a rank that joined scores its
shard with it too).

Cases, each with 1, 2 and 3 ranks: an MLP with cross_entropy, SGD momentum, a cosine
schedule with warmup and clipping that clips, grad_accum 2 and uneven per-rank data (join:
rank 1 runs out after 3 of 5 steps, rank 2 after 2, so the eval at step 2 has every rank
live, those at steps 4 and 5 joined ones); AdamW with a linear schedule, mse and eval with
max_batches on even shards.
"""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from pylib import ddp as H


@pytest.fixture(autouse=True)
def _skip_code(request):
    H.install_skip_code(request.config)


@pytest.fixture
def work(tmp_path):
    return H.workdir("sched-eval-") if H.os.environ.get("DDPD_TEST_TMP") else tmp_path


def torch_eval(torch, model_layers, state, loss, ex, ey, world, batch_size, max_batches):
    """(loss, accuracy or None, samples) of a PyTorch eval loop over every rank's shard."""
    nn = torch.nn
    acts = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}
    layers = [nn.Linear(l["in"], l["out"], bias=l.get("bias", True)) if l["type"] == "linear"
              else acts[l["type"]]() for l in model_layers]
    m = nn.Sequential(*layers).float()
    m.load_state_dict({k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in state.items()})
    m.eval()
    total, elems, correct, samples = 0.0, 0, 0, 0
    with torch.no_grad():
        for r in range(world):
            x, y = ex[r::world], ey[r::world]
            nb = -(-len(x) // batch_size)
            if max_batches:
                nb = min(nb, max_batches)
            for b in range(nb):
                xb = torch.from_numpy(np.ascontiguousarray(x[b * batch_size:(b + 1) * batch_size], np.float32))
                out = m(xb)
                if loss == "cross_entropy":
                    yb = torch.from_numpy(np.asarray(y[b * batch_size:(b + 1) * batch_size], np.int64))
                    total += float(nn.functional.cross_entropy(out, yb, reduction="sum"))
                    correct += int((out.argmax(dim=1) == yb).sum())
                    elems += len(xb)
                else:
                    yb = torch.from_numpy(np.asarray(y[b * batch_size:(b + 1) * batch_size], np.float32))
                    total += float(nn.functional.mse_loss(out, yb.reshape(out.shape), reduction="sum"))
                    elems += out.numel()
                samples += len(xb)
    return total / elems, (correct / elems if loss == "cross_entropy" else None), samples


def run_case(work, case, eval_xy):
    torch = H.need_torch()
    H.need_bin()
    data = Path(work) / "data"
    spec = case.write(data)
    ex, ey = eval_xy
    np.save(data / "ex.npy", ex)
    np.save(data / "ey.npy", ey)
    run = H.run_ddpd(spec, case.world, work)
    run.check_ok(case.world)
    ref = H.torch_ddp(case, work)
    problems = []

    m = H.compare_all_losses(run.losses(), ref)
    if m:
        problems.append(m)
    m = H.compare_tensors(run.model(), ref[0]["state"])
    if m:
        problems.append(m)

    # lr and grad_norm on every loss event, against the rank's own PyTorch step
    clip = case.spec.get("grad_clip", 0)
    clipped = 0
    for e in run.of("loss"):
        r, st = int(e["rank"]), int(e["step"])
        want_lr = ref[r]["lr"].get(st)
        if want_lr is None or not math.isclose(e.get("lr", float("nan")), want_lr, rel_tol=1e-12, abs_tol=0):
            problems.append(f"rank {r} step {st}: lr {e.get('lr')}, PyTorch's LambdaLR {want_lr}")
        if clip:
            want = ref[r]["grad_norm"].get(st)
            got = e.get("grad_norm")
            if want is None or got is None or abs(got - want) > 1e-5 * abs(want) + 1e-7:
                problems.append(f"rank {r} step {st}: grad_norm {got}, clip_grad_norm_ {want}")
            clipped += want is not None and want > clip
        elif "grad_norm" in e:
            problems.append(f"grad_norm without grad_clip: {e}")
    if clip and not clipped:
        problems.append("no step clipped: the case does not test clipping (test bug)")

    # eval events: rank 0 only, at every every_steps-th step and the last one (once)
    ev = case.spec["eval"]
    total = max(case.steps_per_epoch()) * case.spec.get("epochs", 1)
    want_steps = sorted({s for s in range(1, total + 1) if s % ev["every_steps"] == 0} | {total})
    evals = run.of("eval")
    if [int(e["rank"]) for e in evals] != [0] * len(evals):
        problems.append(f"eval events from ranks {[e['rank'] for e in evals]}, want rank 0 only")
    got_steps = [int(e["step"]) for e in evals]
    if got_steps != want_steps:
        problems.append(f"eval events at steps {got_steps}, want {want_steps}")
    for e in evals:
        st = int(e["step"])
        owner = max(r for r in range(case.world) if st in ref[r]["snapshots"])
        wl, wa, ws = torch_eval(torch, case.spec["model"], ref[owner]["snapshots"][st], case.spec["loss"], ex, ey,
                                case.world, case.spec["batch_size"], ev.get("max_batches", 0))
        if abs(e["loss"] - wl) > 1e-5 * abs(wl) + 1e-7:
            problems.append(f"eval at step {st}: loss {e['loss']}, PyTorch {wl}")
        if wa is None:
            if "accuracy" in e:
                problems.append(f"eval at step {st}: accuracy for mse: {e}")
        elif e.get("accuracy") != wa:
            problems.append(f"eval at step {st}: accuracy {e.get('accuracy')}, PyTorch {wa}")
        if e.get("samples") != ws:
            problems.append(f"eval at step {st}: samples {e.get('samples')}, PyTorch {ws}")
    # each eval event follows its step's loss event on stdout
    order = [(x.get("event"), x.get("step")) for x in run.events if x.get("rank") == 0]
    for st in got_steps:
        if ("loss", st) in order and order.index(("loss", st)) > order.index(("eval", st)):
            problems.append(f"the eval event of step {st} came before its loss event")

    assert not problems, "ddpd differs from PyTorch:\n" + "\n".join(problems) + "\n\n" + run.describe()
    return run


@pytest.mark.parametrize("world", [1, 2, 3])
def test_cosine_warmup_clip_accum_join_eval(work, world):
    model = H.mlp(6, 16, 3)
    # 10, 6 and 4 batches: steps of 2 micro-batches on every rank (PyTorch's join needs the
    # same sync pattern on every rank); rank 1 joins after step 3 of 5, rank 2 after step 2
    xs, ys = zip(*[H.make_xy(n, 6, 3, "cross_entropy", seed=31 + r) for r, n in enumerate([40, 24, 16][:world])])
    ex, ey = H.make_xy(30, 6, 3, "cross_entropy", seed=33)
    spec = {"name": "sched-eval", "device": "cpu", "model": model, "loss": "cross_entropy",
            "optimizer": {"type": "sgd", "lr": 0.5, "momentum": 0.9,
                          "schedule": {"type": "cosine", "warmup_steps": 2, "min_lr": 0.01}},
            "batch_size": 4, "epochs": 1, "grad_accum": 2, "log_every": 1, "grad_clip": 0.3,
            "eval": {"data": {"type": "npy", "x": "ex.npy", "y": "ey.npy"}, "every_steps": 2}}
    case = H.Case.per_rank(spec, xs, ys, H.init_weights(model, 7))
    assert case.steps_per_epoch() == [5, 3, 2][:world]
    run = run_case(work, case, (ex, ey))
    assert [[int(e["step"]) for e in run.of("join", r)] for r in range(world)] == [[], [3], [2]][:world]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_adamw_linear_mse_eval_max_batches(work, world):
    model = H.mlp(5, 12, 2, act="tanh")
    x, y = H.make_xy(24 * world, 5, 2, "mse", seed=41)  # 6 steps of 4 rows per rank
    ex, ey = H.make_xy(40, 5, 2, "mse", seed=42)
    spec = {"name": "sched-eval-mse", "device": "cpu", "model": model, "loss": "mse",
            "optimizer": {"type": "adamw", "lr": 0.01, "weight_decay": 0.1,
                          "schedule": {"type": "linear", "warmup_steps": 1, "min_lr": 0.001, "total_steps": 5}},
            "batch_size": 4, "epochs": 1, "log_every": 1,
            "eval": {"data": {"type": "npy", "x": "ex.npy", "y": "ey.npy"}, "every_steps": 3, "max_batches": 2}}
    case = H.Case.sharded(spec, world, x, y, H.init_weights(model, 8))
    run = run_case(work, case, (ex, ey))
    # max_batches 2 of batch 4 on each rank; past total_steps 5 the lr stays at min_lr
    assert {e["samples"] for e in run.of("eval")} == {8 * world}
    assert [e["lr"] for e in run.of("loss", 0) if e["step"] > 5] == [pytest.approx(0.001, rel=1e-12)]


@pytest.mark.cpu_only("the eval data's shapes are checked on the host before training")
def test_eval_data_errors_name_the_eval_data(work):
    H.need_bin()
    data = Path(work) / "data"
    data.mkdir(parents=True, exist_ok=True)
    x, y = H.make_xy(16, 4, 2, "mse", seed=51)
    np.save(data / "x.npy", x)
    np.save(data / "y.npy", y)
    np.save(data / "ex.npy", x[:, :3])
    np.save(data / "ey.npy", y)
    spec = {"name": "eval-err", "device": "cpu", "model": H.mlp(4, 2), "loss": "mse",
            "optimizer": {"type": "sgd", "lr": 0.1}, "batch_size": 4, "epochs": 1,
            "data": {"type": "npy", "x": "x.npy", "y": "y.npy"},
            "eval": {"data": {"type": "npy", "x": "ex.npy", "y": "ey.npy"}, "every_steps": 2}}
    run = H.run_ddpd(spec, 2, work)
    assert run.rc == 2, run.describe()
    msgs = [e["message"] for e in run.of("error")]
    assert msgs and all(m.startswith("eval.data: ex.npy: ") and "3 columns" in m for m in msgs), msgs
