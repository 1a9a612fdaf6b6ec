"""test_nonfinite.py — a loss that becomes NaN or infinite (issue 15 item 13). With
`on_nonfinite: "fail"` (the default) every rank fails at that step, the error naming the
rank whose loss it was and the step, including a rank that has joined and is shadowing
the others; the step's loss event (null, nonfinite) comes before the error. With
"continue" the job trains on and succeeds with null losses. Data with a NaN in rank 1's
third batch makes the step known in advance; an overflow to infinity (no NaN anywhere in
the data) and a learning rate that blows the weights up are the variants.
"""
from pathlib import Path

import numpy as np
import pytest

from pylib import ddp as H


@pytest.fixture(autouse=True)
def _skip_code(request):
    H.install_skip_code(request.config)


@pytest.fixture
def work(tmp_path):
    return H.workdir("nonfinite-") if H.os.environ.get("DDPD_TEST_TMP") else tmp_path


MODEL = H.mlp(3, 6, 2)


def per_rank_job(work, sizes, poison, value, on_nonfinite=None, loss="mse"):
    """{rank} npy files of the given row counts; `poison` = (rank, row) gets `value` in x."""
    data = Path(work) / "data"
    data.mkdir(parents=True, exist_ok=True)
    x, y = H.make_xy(sum(sizes), 3, 2, loss, seed=8)
    lo = 0
    for r, n in enumerate(sizes):
        xr = x[lo:lo + n].copy()
        if poison and poison[0] == r:
            xr[poison[1], 0] = value
        np.save(data / f"x_{r}.npy", xr)
        np.save(data / f"y_{r}.npy", y[lo:lo + n])
        lo += n
    spec = {"name": "nf", "device": "cpu", "world_size": len(sizes), "model": MODEL, "loss": loss,
            "optimizer": {"type": "sgd", "lr": 0.01}, "batch_size": 2, "epochs": 1, "log_every": 5,
            "data": {"type": "npy", "x": "x_{rank}.npy", "y": "y_{rank}.npy", "shuffle": False},
            "init": {"seed": 1}}
    if on_nonfinite:
        spec["on_nonfinite"] = on_nonfinite
    return spec


def assert_failed_at(run, world, rank, step):
    assert run.rc != 0, run.describe()
    errs = run.of("error")
    assert sorted(e["rank"] for e in errs) == list(range(world)), f"error events {errs}\n" + run.describe()
    for e in errs:
        assert e["kind"] == "nonfinite", e
        assert f"step {step} " in e["message"] and f"rank {rank} " in e["message"], e
    assert not run.of("done"), run.of("done")
    # the bad step's loss is reported (null, nonfinite) before the error, whatever log_every
    bad = [e for e in run.of("loss", rank=rank) if e["step"] == step]
    assert bad and bad[0]["loss"] is None and bad[0].get("nonfinite") is True, run.of("loss", rank=rank)
    assert all(e["step"] <= step for e in run.of("loss")), run.of("loss")
    # every rank exits 1 ("anything else", CONTRACT.md §6), none with a comm error
    assert "exit code 1" in run.stderr and "exit code 3" not in run.stderr, run.describe()


def test_nan_on_one_rank_fails_every_rank_at_that_step(work):
    H.need_bin()
    # rank 1's row 4 is batch 3 (rows 4, 5): the loss of step 3 is NaN on rank 1 only
    spec = per_rank_job(work, [8, 8], (1, 4), np.nan)
    run = H.run_ddpd(spec, 2, work, name="nan")
    assert_failed_at(run, 2, 1, 3)


def test_nonfinite_while_another_rank_has_joined(work):
    H.need_bin()
    # rank 0 has 1 batch and joins after step 1; rank 2's loss overflows to infinity at
    # step 3 (1e30 squared is inf in float32; no NaN anywhere in the data): the joined rank
    # 0, shadowing, fails at step 3 as well instead of waiting for the others
    spec = per_rank_job(work, [2, 10, 10], (2, 5), 1e30)
    run = H.run_ddpd(spec, 3, work, name="inf")
    assert_failed_at(run, 3, 2, 3)
    assert [e["step"] for e in run.of("join", rank=0)] == [1], run.of("join")


def test_divergence_from_a_huge_learning_rate_fails_single_rank(work):
    H.need_bin()
    spec = per_rank_job(work, [40], None, 0)
    spec["world_size"] = 1
    spec["data"] = {"type": "synthetic", "samples": 200, "seed": 3}
    spec["optimizer"] = {"type": "sgd", "lr": 1e18}
    spec["epochs"] = 3
    run = H.run_ddpd(spec, 1, work, name="lr")
    assert run.rc != 0, run.describe()
    errs = run.of("error")
    assert len(errs) == 1 and errs[0]["kind"] == "nonfinite" and "rank 0 " in errs[0]["message"], errs
    step = int(errs[0]["message"].split("step ")[1].split()[0])
    assert 1 < step < 300, errs
    assert [e["step"] for e in run.of("loss") if e["loss"] is None] == [step], run.of("loss")


def test_continue_trains_on(work):
    H.need_bin()
    spec = per_rank_job(work, [8, 8], (1, 4), np.nan, on_nonfinite="continue")
    spec["log_every"] = 1
    run = H.run_ddpd(spec, 2, work, name="cont").check_ok(2)
    by = run.losses()
    assert by[1][3] is None and by[0][1] is not None, by
    assert sorted(e["rank"] for e in run.of("done")) == [0, 1]
