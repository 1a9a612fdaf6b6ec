"""A restart after a killed rank continues exactly (issue 15 item 12), through the server:
a 3-rank job with uneven shards (join on: ranks 1 and 2 join for the last step of every
epoch, so their AdamW state differs from rank 0's) and checkpoints, one rank SIGKILLed
after a checkpoint; the server restarts the job from its latest checkpoint. The restarted
job's final weights and every rank's optimizer state are bitwise those of the same job run
without a kill, and so is every loss the second attempt logged.
"""
import os
import signal

from pylib.server import PausingWorker, seed_spec, wait_until

FINAL = ("succeeded", "failed", "cancelled")


def spec_of(name):
    # 601 samples over 3 ranks in batches of 2: shards 201, 200, 200 -> 101, 100, 100
    # batches; 20 epochs = 2,020 steps, a checkpoint every 50
    return seed_spec(name=name, world_size=3, epochs=20, batch_size=2, max_restarts=1, log_every=1,
                     model=[{"type": "linear", "in": 10, "out": 16}, {"type": "tanh"},
                            {"type": "linear", "in": 16, "out": 5}],
                     optimizer={"type": "adamw", "lr": 0.003, "weight_decay": 0.02},
                     data={"type": "synthetic", "samples": 601, "seed": 4},
                     checkpoint={"every_steps": 50, "keep_last": 1000})


def losses(srv, jid, attempt=None):
    """{(rank, step): loss} of a job's loss events (of one attempt)."""
    return {(e["rank"], e["step"]): e["loss"] for e in srv.events(jid, timeout=120)
            if e.get("event") == "loss" and (attempt is None or e.get("attempt") == attempt)}


def test_restart_after_a_killed_rank_is_exact(make_server, work):
    # The job pauses after its checkpoint of step 150, so rank 1 dies mid-run however fast
    # the ranks train; its restart and the uninterrupted run run unpaused.
    paused = PausingWorker(work, at_step=150)
    srv = make_server(cpu_slots=3, env=paused.env)
    jid = srv.submit(spec_of("killed"))["id"]
    d = srv.jobs_dir / str(jid)
    # Kill rank 1 once a checkpoint after the first epoch's join is there (before it, all
    # ranks' optimizer states are still equal) and the job is still running.
    def late_ckpt():
        return any(p.name[5:].isdigit() and int(p.name[5:]) >= 150 for p in d.glob("ckpt-*"))
    wait_until(late_ckpt, 120, "a checkpoint after step 150", interval=0.01)
    j = srv.job(jid)
    assert j["state"] == "running" and j["attempt"] == 1, f"the job ended before the kill: {j}"
    pid = {r["rank"]: r["pid"] for r in j["ranks"]}[1]
    os.kill(pid, signal.SIGKILL)
    paused.release()
    j = srv.wait_state(jid, FINAL, timeout=300)
    assert j["state"] == "succeeded" and j["attempt"] == 2, j
    ref = srv.submit(spec_of("straight"))["id"]
    assert srv.wait_state(ref, FINAL, timeout=300)["state"] == "succeeded", srv.job(ref)
    ckpts = sorted(int(p.name.split("-")[1]) for p in d.glob("ckpt-*") if not p.name.endswith(".tmp"))
    assert ckpts, "no checkpoint left to resume from"

    rdir = srv.jobs_dir / str(ref)
    want = losses(srv, ref)
    got = losses(srv, jid, attempt=2)
    first = min(s for _, s in got)
    assert first > 1 and first - 1 in ckpts, f"attempt 2 started at step {first}, checkpoints {ckpts}"
    diff = [(k, got[k], want[k]) for k in sorted(got) if got[k] != want.get(k)]
    assert not diff, f"losses of the restarted attempt differ (rank/step, restarted, straight): {diff[:10]}"
    assert len(got) > 1000, len(got)
    assert (d / "model.safetensors").read_bytes() == (rdir / "model.safetensors").read_bytes(), \
        "the final weights differ from the uninterrupted run's"

    names = sorted(p.name for p in rdir.glob("*.safetensors"))
    assert names == ["model.safetensors", "optim-rank-1.safetensors", "optim-rank-2.safetensors",
                     "optim.safetensors"], names
    for n in names:
        assert (d / n).read_bytes() == (rdir / n).read_bytes(), f"{n} differs from the uninterrupted run's"
