"""test_pause.py — a pause (`ddpd run --stop-at S`, the job document's `stop_at`: what a
sweep's ASHA rung runs) on the CPU and (parity_emu) the emulated GPU with NCCL: 2 ranks
with uneven shards (join) and a cosine schedule over the spec's steps stop after step S
with OUT/ckpt-S written, no final model, and `stop_reason` "paused at step S"; resumed
from that checkpoint (and paused again, as a promotion to the next rung does) every loss
after the pause, the lr and the final weights equal the run that never paused, bit for
bit."""
import numpy as np

from pylib import ddp as H
from test_early_stop import _skip_code, work  # noqa: F401 (its fixtures: a folder with an empty data/)


def spec():
    """33 samples over 2 ranks, batch 8: shards of 17 and 16 rows (join on); a cosine
    schedule over 60 steps, so a run that took its pause step for its last would differ."""
    return {"name": "pause", "model": H.mlp(8, 32, 4), "loss": "cross_entropy",
            "optimizer": {"type": "adamw", "lr": 0.01, "schedule": {"type": "cosine", "warmup_steps": 5}},
            "data": {"type": "synthetic", "samples": 33, "seed": 1},
            "eval": {"data": {"type": "synthetic", "samples": 64, "seed": 2}, "every_steps": 10},
            "batch_size": 8, "steps": 60, "init": {"seed": 3}, "log_every": 1}


def losses(run):
    return {(e["rank"], e["step"]): (e["loss"], e.get("lr")) for e in run.of("loss")}


def test_a_paused_run_resumed_goes_on_as_the_straight_one(work):
    H.need_bin()
    straight = H.run_ddpd(spec(), 2, work, name="straight").check_ok(2)
    assert straight.of("join"), "the shards should be uneven (join on)"

    first = H.run_ddpd(spec(), 2, work, name="rung0", extra=("--stop-at", "13")).check_ok(2)
    for e in first.of("done"):
        assert e["steps"] == 13 and e["stop_reason"] == "paused at step 13", e
    assert (first.out / "ckpt-13").is_dir()
    assert not (first.out / "model.safetensors").exists(), "a paused run has no final model"
    # The steps it ran are the straight run's (the schedule is the spec's, not 13 steps').
    mine = losses(first)
    assert mine and all(straight_v == mine[k] for k, straight_v in losses(straight).items() if k in mine)
    assert max(s for _, s in mine) == 13

    # Promoted: resumed from ckpt-13 and paused again at 40 (an eval step), then to the end.
    second = H.run_ddpd(spec(), 2, work, name="rung1",
                        extra=("--resume", str(first.out / "ckpt-13"), "--stop-at", "40")).check_ok(2)
    assert [e["steps"] for e in second.of("done")] == [40, 40]
    assert (second.out / "ckpt-40").is_dir() and not (second.out / "model.safetensors").exists()
    last = H.run_ddpd(spec(), 2, work, name="rung2", extra=("--resume", str(second.out / "ckpt-40"))).check_ok(2)
    assert [e.get("stop_reason") or "" for e in last.of("done")] == ["", ""]

    want = losses(straight)
    got = {**losses(first), **losses(second), **losses(last)}
    assert sorted(got) == sorted(want)
    bad = [k for k in want if got[k] != want[k]]
    assert not bad, [(k, want[k], got[k]) for k in bad[:5]]
    evals = lambda *runs: sorted((e["step"], e.get("rank", 0), e["loss"]) for r in runs for e in r.of("eval"))
    assert evals(first, second, last) == evals(straight)
    a, b = H.st_load(straight.out / "model.safetensors"), H.st_load(last.out / "model.safetensors")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_a_pause_at_or_past_the_last_step_runs_to_the_end(work):
    H.need_bin()
    run = H.run_ddpd(spec(), 1, work, name="past", extra=("--stop-at", "60")).check_ok(1)
    assert [e.get("stop_reason") or "" for e in run.of("done")] == [""]
    assert (run.out / "model.safetensors").exists()
    bad = H.run_ddpd(spec(), 1, work, name="bad", extra=("--stop-at", "0"))
    assert bad.rc == 2 and "--stop-at" in bad.stderr
