"""test_ddp_examples_doc.py — the four examples of the document the project started from
(../shared/seed-ddp-class.txt: constructing DDP around `nn.Linear(10, 5)`, a forward and
backward pass on a [3, 10] batch, `no_sync`, and `join` with SGD lr 0.01 and MSELoss) run
as `ddpd run --world-size 2` jobs, each against real PyTorch 1.13 DDP on the same data
(gloo, CPU), plus examples/seed.json with two ranks.
"""
import json
import os
from pathlib import Path

import numpy as np
import pytest

from pylib import ddp as H

REPO = Path(__file__).resolve().parents[2]
LINEAR_10_5 = [{"type": "linear", "in": 10, "out": 5}]


@pytest.fixture(autouse=True)
def _skip_code(request):
    H.install_skip_code(request.config)


@pytest.fixture
def work(tmp_path):
    return H.workdir("e2e-ddp-doc-") if os.environ.get("DDPD_TEST_TMP") else tmp_path


def doc_spec(**kw):
    s = {"name": "seed-ddp-class", "device": "cpu", "model": LINEAR_10_5, "loss": "mse",
         "optimizer": {"type": "sgd", "lr": 0.01}, "batch_size": 3, "epochs": 1, "log_every": 1}
    s.update(kw)
    return s


def parity(case, work):
    H.need_bin()
    H.need_torch()
    spec = case.write(work / "data")
    run = H.run_ddpd(spec, case.world, work)
    run.check_ok(case.world)
    ref = H.torch_ddp(case, work)
    problems = [m for m in (H.compare_all_losses(run.losses(), ref), H.compare_tensors(run.model(), ref[0]["state"]))
                if m]
    assert not problems, "\n".join(problems) + "\n\n" + run.describe()
    return run


def test_example_1_construct(work):
    """DDP(nn.Linear(10, 5)) on 2 ranks: both ranks start with the 55 parameters of the
    model and the world size, and end with the same model (rank 0 writes it)."""
    H.need_bin()
    x, y = H.make_xy(6, 10, 5, "mse", seed=1)
    case = H.Case.sharded(doc_spec(), 2, x, y, H.init_weights(LINEAR_10_5, 1))
    spec = case.write(work / "data")
    run = H.run_ddpd(spec, 2, work).check_ok(2)
    starts = {e["rank"]: e for e in run.of("start")}
    assert sorted(starts) == [0, 1], run.describe()
    for r, e in starts.items():
        assert e.get("params") == 55 and e.get("world_size") == 2, f"rank {r}: {e}"
    m = run.model()
    assert m["0.weight"].shape == (5, 10) and m["0.bias"].shape == (5,)


def test_example_2_forward_backward(work):
    # data = torch.randn(3, 10) per rank; one synced step; the contract's losses are mse
    # and cross_entropy, so MSELoss against a target stands in for res.sum()
    x, y = H.make_xy(6, 10, 5, "mse", seed=2)
    parity(H.Case.sharded(doc_spec(), 2, x, y, H.init_weights(LINEAR_10_5, 2)), work)


def test_example_3_no_sync(work):
    # a micro-batch under no_sync, then a synced one (grad_accum 2)
    x, y = H.make_xy(12, 10, 5, "mse", seed=3)
    parity(H.Case.sharded(doc_spec(grad_accum=2), 2, x, y, H.init_weights(LINEAR_10_5, 3)), work)


def test_example_4_join(work):
    # with ddp_model.join(): rank 0 has one batch of 3, rank 1 two; SGD lr 0.01, MSELoss
    x, y = H.make_xy(9, 10, 5, "mse", seed=4)
    case = H.Case.per_rank(doc_spec(), [x[:3], x[3:]], [y[:3], y[3:]], H.init_weights(LINEAR_10_5, 4))
    run = parity(case, work)
    assert [(e["rank"], e["step"]) for e in run.of("join")] == [(0, 1)], run.describe()


def test_seed_json_two_ranks(work):
    """examples/seed.json (synthetic data, 3000 samples, batch 3) with --world-size 2:
    1500 samples per rank, 500 steps, a loss event every 100 steps from both ranks."""
    H.need_bin()
    spec = json.loads((REPO / "examples" / "seed.json").read_text())
    (work / "data").mkdir()
    run = H.run_ddpd(spec, 2, work).check_ok(2)
    for r in range(2):
        steps = sorted(int(e["step"]) for e in run.of("loss", r))
        assert steps == [100, 200, 300, 400, 500], f"rank {r} logged steps {steps}"
        assert [e.get("batches") for e in run.of("start", r)] == [500]
        assert [e.get("steps") for e in run.of("done", r)] == [500]
    assert not run.of("join")
    assert all(np.isfinite(e["loss"]) for e in run.of("loss"))
