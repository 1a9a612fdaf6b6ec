"""test_empty_rank.py — a rank with nothing to do (issue 15 item 18), against PyTorch 1.13
DDP (gloo): a `{rank}` file with zero rows (npy and CSV) is not bad input: that rank joins
at once and shadows every step of the others, with the divisor PyTorch uses (W by default,
the live ranks with divide_by_initial_world_size false). Compared: every rank's losses,
the final weights, the join events. Without join such a rank is an error that names it
and says that join would run it. Fewer synthetic samples than ranks runs the same way.
"""
from pathlib import Path

import numpy as np
import pytest

from pylib import ddp as H
from pylib.parity import write_csv


@pytest.fixture(autouse=True)
def _skip_code(request):
    H.install_skip_code(request.config)


@pytest.fixture
def work(tmp_path):
    return H.workdir("empty-rank-") if H.os.environ.get("DDPD_TEST_TMP") else tmp_path


def spec_of(model, loss, optimizer, batch_size, epochs=2, grad_accum=1, ddp=None):
    s = {"name": "empty-rank", "device": "cpu", "model": model, "loss": loss, "optimizer": optimizer,
         "batch_size": batch_size, "epochs": epochs, "grad_accum": grad_accum, "log_every": 1}
    if ddp:
        s["ddp"] = ddp
    return s


def as_csv(case, spec, data_dir):
    """Rewrites a per-rank case's npy files as d_{rank}.csv (header only for an empty rank)."""
    fout = case.ys[0].shape[1] if case.ys[0].ndim == 2 else 1
    names = [f"t{j}" for j in range(fout)] if spec["loss"] == "mse" else ["label"]
    for r in range(case.world):
        x = np.asarray(case.xs[r], dtype=np.float32)
        if len(x) == 0:  # a header row and nothing else
            cols = [f"f{j}" for j in range(case.xs[0].shape[1] if len(case.xs[0]) else x.shape[1])] + names
            (Path(data_dir) / f"d_{r}.csv").write_text(",".join(cols) + "\n")
        else:
            write_csv(Path(data_dir) / f"d_{r}.csv", x, case.ys[r], names, spec["loss"])
    spec = dict(spec)
    spec["data"] = {"type": "csv", "path": "d_{rank}.csv", "target": names if len(names) > 1 else names[0],
                    "shuffle": False}
    return spec


def check(case, work, kind="npy"):
    H.need_bin()
    H.need_torch()
    spec = case.write(Path(work) / "data")
    if kind == "csv":
        spec = as_csv(case, spec, Path(work) / "data")
    run = H.run_ddpd(spec, case.world, work)
    run.check_ok(case.world)
    ref = H.torch_ddp(case, work)
    problems = [m for m in (H.compare_all_losses(run.losses(), ref), H.compare_tensors(run.model(), ref[0]["state"]))
                if m]
    for r in range(case.world):
        got = sorted(int(e["step"]) for e in run.of("join", r))
        if got != sorted(ref[r]["joins"]):
            problems.append(f"rank {r}: join events at steps {got}, PyTorch's after steps {ref[r]['joins']}")
    assert not problems, "ddpd differs from PyTorch DDP:\n" + "\n".join(problems) + "\n\n" + run.describe()
    return run, ref


CASES = {
    # rank 1 of 3 has an empty file; momentum, so the divisor shows in every later step
    "w3_mse_momentum_divide_w": ("mse", {"type": "sgd", "lr": 0.1, "momentum": 0.9}, [7, 0, 5], {}),
    # the same with the live-rank divisor (DDP.md §4.3 False)
    "w3_mse_divide_live": ("mse", {"type": "sgd", "lr": 0.1}, [7, 0, 5], {"divide_by_initial_world_size": False}),
    # rank 0 is the empty one (so the final sync and rank 0's own files come from another
    # rank), cross_entropy and adamw
    "w2_ce_adamw_rank0_empty": ("cross_entropy", {"type": "adamw", "lr": 0.01}, [0, 9], {}),
}


@pytest.mark.parametrize("kind", ["npy", pytest.param("csv", marks=pytest.mark.cpu_only(
    "an empty CSV file is the host reader's case: the device sees the npy case's batches"))])
@pytest.mark.parametrize("name", sorted(CASES))
def test_empty_rank_file_matches_pytorch(work, name, kind):
    loss, opt, sizes, ddp = CASES[name]
    model = H.mlp(3, 6, 3)
    x, y = H.make_xy(sum(sizes), 3, 3, loss, seed=31)
    xs, ys, lo = [], [], 0
    for n in sizes:
        xs.append(x[lo:lo + n])
        ys.append(y[lo:lo + n])
        lo += n
    spec = spec_of(model, loss, opt, batch_size=2, ddp=ddp or None)
    case = H.Case.per_rank(spec, xs, ys, H.init_weights(model, 4))
    run, _ = check(case, work, kind)
    empty = sizes.index(0)
    S = max(case.steps_per_epoch())
    assert [e["step"] for e in run.of("join", empty)] == [0, S], run.of("join", empty)
    assert not run.of("loss", empty), "a rank without data reports no loss"


def test_empty_rank_with_grad_accum(work):
    model = H.mlp(3, 5, 2)
    x, y = H.make_xy(13, 3, 2, "mse", seed=32)
    spec = spec_of(model, "mse", {"type": "sgd", "lr": 0.05, "momentum": 0.5}, batch_size=2, grad_accum=2)
    check(H.Case.per_rank(spec, [x[:13], x[:0]], [y[:13], y[:0]], H.init_weights(model, 5)), work)


def test_empty_rank_without_join_names_it(work):
    H.need_bin()
    model = H.mlp(3, 4, 2)
    x, y = H.make_xy(6, 3, 2, "mse", seed=33)
    spec = spec_of(model, "mse", {"type": "sgd", "lr": 0.1}, batch_size=2, ddp={"join": False})
    case = H.Case.per_rank(spec, [x, x[:0]], [y, y[:0]], H.init_weights(model, 6))
    run = H.run_ddpd(case.write(Path(work) / "data"), 2, work)
    assert run.rc != 0, run.describe()
    msgs = [e["message"] for e in run.of("error")]
    assert msgs and all("rank 1 has no batch" in m and "join" in m and "auto" in m for m in msgs), msgs
    assert "exit code 2" in run.stderr, run.describe()


def test_fewer_synthetic_samples_than_ranks(work):
    H.need_bin()
    spec = spec_of(H.mlp(3, 4, 2), "mse", {"type": "sgd", "lr": 0.1}, batch_size=1)
    spec.update(world_size=4, data={"type": "synthetic", "samples": 2, "seed": 1}, init={"seed": 2})
    (Path(work) / "data").mkdir(parents=True, exist_ok=True)
    run = H.run_ddpd(spec, 4, work).check_ok(4)
    for r in (2, 3):
        assert [e["step"] for e in run.of("join", r)] == [0, 1], run.of("join", r)
        assert not run.of("loss", r)
    spec["ddp"] = {"join": False}
    run = H.run_ddpd(spec, 4, work, name="nojoin")
    # refused by `ddpd run` before any rank starts (the counts follow from the spec)
    assert run.rc == 2 and "rank 2 has no batch" in run.stderr and "join" in run.stderr, run.describe()
