"""test_early_stop.py — early_stop and checkpoint.keep_best through `ddpd run` (issue 31),
on the CPU and (parity_emu) the emulated GPU with NCCL: 2 ranks with uneven shards (join:
the rank that ran out of batches shadows the steps in which the job stops) stop at the
step Lightning's rule (pylib/early_stop.py) gives from the run's eval events; a NaN eval
stops at once (check_finite); a run resumed from a checkpoint after its best eval, under
join with per-rank optimizer state, stops at the same step and keeps the same best
checkpoint, bit for bit."""
import shutil

import numpy as np
import pytest

from pylib import ddp as H
from pylib.early_stop import lightning_stop, stop_reason


@pytest.fixture(autouse=True)
def _skip_code(request):
    H.install_skip_code(request.config)


@pytest.fixture
def work(tmp_path):
    w = H.workdir("early-stop-") if H.os.environ.get("DDPD_TEST_TMP") else tmp_path
    (w / "data").mkdir(parents=True, exist_ok=True)  # synthetic data: an empty --data-dir
    return w


def overfit(**over):
    """33 samples over 2 ranks, batch 8: shards of 17 and 16 rows, 3 and 2 batches (join
    on); eval on 256 rows of the same teacher. The eval loss falls, then rises."""
    s = {"name": "overfit", "model": H.mlp(8, 32, 4), "loss": "cross_entropy",
         "optimizer": {"type": "adamw", "lr": 0.01},
         "data": {"type": "synthetic", "samples": 33, "seed": 1},
         "eval": {"data": {"type": "synthetic", "samples": 256, "seed": 1}, "every_steps": 4},
         "batch_size": 8, "steps": 400, "init": {"seed": 3}, "log_every": 50}
    s.update(over)
    return s


def evals(run):
    return [(e["step"], e["loss"]) for e in run.of("eval")]


def test_two_ranks_under_join_stop_where_the_rule_says(work):
    H.need_bin()
    es = {"metric": "eval_loss", "patience": 5, "min_delta": 0.002}
    run = H.run_ddpd(overfit(early_stop=es), 2, work, name="join").check_ok(2)
    assert run.of("join"), "the shards should be uneven (join on)"
    stop, best_step, best = lightning_stop(evals(run), "min", 5, 0.002)
    assert evals(run)[-1][0] == stop < 400, evals(run)
    for e in run.of("done"):
        assert e["steps"] == stop and e["stop_reason"] == stop_reason(stop, best_step, best), e
    assert (run.out / "model.safetensors").exists()


def test_a_nonfinite_eval_stops_at_once(work):
    H.need_bin()
    # An lr that blows the weights up: with on_nonfinite "continue" the job trains on
    # until the eval's loss is not finite, and check_finite stops it there.
    spec = overfit(optimizer={"type": "sgd", "lr": 1e18}, on_nonfinite="continue",
                   early_stop={"metric": "eval_loss", "patience": 100})
    run = H.run_ddpd(spec, 1, work, name="nan").check_ok(1)
    ev = evals(run)
    bad = [s for s, v in ev if v is None]
    assert bad and ev[-1][0] == bad[0], ev
    done = run.of("done")[0]
    assert done["steps"] == bad[0] and "eval_loss is not finite" in done["stop_reason"], done


def test_a_resumed_run_under_join_stops_and_keeps_the_best_as_the_straight_one(work):
    H.need_bin()
    spec = overfit(early_stop={"metric": "eval_loss", "patience": 6},
                   checkpoint={"every_steps": 4, "keep_last": 1000, "keep_best": {"metric": "eval_loss"}})
    straight = H.run_ddpd(spec, 2, work, name="straight").check_ok(2)
    best = [p.name for p in straight.out.iterdir() if p.name.startswith("best-")]
    assert len(best) == 1, best
    best_step = int(best[0][5:])
    stop = straight.of("done")[0]["steps"]
    # A checkpoint after the best eval and before the stop, inside an epoch of rank 0's
    # (replicas and per-rank optimizer state: join).
    mid = next(s for s in range(best_step + 4, stop, 4) if s % 3)
    resumed = H.run_ddpd(spec, 2, work, name="resumed", extra=("--resume", str(straight.out / f"ckpt-{mid}")))
    resumed.check_ok(2)
    assert [e["steps"] for e in resumed.of("done")] == [stop, stop]
    assert resumed.of("done")[0]["stop_reason"] == straight.of("done")[0]["stop_reason"]
    # The resumed run's folder has no best-S of its own (its best was before the
    # checkpoint): the straight run's best is the one the checkpoint's state names.
    assert not [p for p in resumed.out.iterdir() if p.name.startswith("best-")]
    assert f"best {best_step} =" in resumed.of("done")[0]["stop_reason"]
    a, b = H.st_load(straight.out / "model.safetensors"), H.st_load(resumed.out / "model.safetensors")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    shutil.rmtree(resumed.out, ignore_errors=True)
