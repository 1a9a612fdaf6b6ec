"""early_stop and checkpoint.keep_best (issue 31) through the server and the CLI: a
fixed-seed job that overfits (32 training samples, eval on 256 of the same teacher: the
eval loss falls to step ~35, then rises) stops at the step that Lightning's
EarlyStopping rule (pylib/early_stop.py) predicts from the job's own eval events, with 1
and 2 ranks; the kept best checkpoint is the best eval's step, with the weights of that
step's checkpoint of an identical run that checkpoints every eval; a job cancelled
mid-way and resumed (`ddpd resume`) stops at the same step with the same best as an
uninterrupted one. Also `ddpd checkpoints` (best, final), `ddpd pull --best` and why a
queued job waits in `ddpd jobs`."""
import json
import shutil
import subprocess

import numpy as np

from pylib.early_stop import lightning_stop
from pylib.safetensors import st_decode
from pylib.server import FOREVER_STEPS, PausingWorker, heavy_spec, wait_until
from test_cli import cli, ddpd

FINAL = ("succeeded", "failed", "cancelled")


def overfit_spec(world_size=1, **over):
    s = {"name": "overfit", "world_size": world_size,
         "model": [{"type": "linear", "in": 8, "out": 32}, {"type": "relu"},
                   {"type": "linear", "in": 32, "out": 4}],
         "loss": "cross_entropy", "optimizer": {"type": "adamw", "lr": 0.01},
         "data": {"type": "synthetic", "samples": 32, "seed": 1},
         "eval": {"data": {"type": "synthetic", "samples": 256, "seed": 1}, "every_steps": 5},
         "batch_size": 8 // world_size, "steps": 400, "init": {"seed": 3}, "log_every": 10}
    s.update(over)
    return s


def eval_losses(server, jid):
    return [(e["step"], e["loss"]) for e in server.events(jid) if e["event"] == "eval"]


def weights(server, jid, step):
    r = server.get(f"/v1/jobs/{jid}/checkpoint", params={"step": step})
    assert r.status_code == 200, r.text
    return st_decode(r.content)[0]


def test_early_stop_at_the_step_the_rule_predicts(server):
    for world in (1, 2):
        es = {"metric": "eval_loss", "mode": "min", "patience": 4, "min_delta": 0.005}
        jid = server.submit(overfit_spec(world, name=f"es{world}", early_stop=es))["id"]
        job = server.wait_state(jid, FINAL, timeout=120)
        assert job["state"] == "succeeded", job
        evals = eval_losses(server, jid)
        want = lightning_stop(evals, "min", 4, 0.005)
        assert want is not None, evals
        stop, best_step, best = want
        assert 30 < stop < 400 and evals[-1][0] == stop, (world, evals)  # it overfits, then stops
        assert job["step"] == stop, (job, want)
        assert job["stop_reason"] == f"early_stopped at step {stop} (best {best_step} = {best:.6g})", job
        evs = server.events(jid)
        done = [e for e in evs if e["event"] == "done"]
        assert sorted(e["rank"] for e in done) == list(range(world)), done
        assert all(e["steps"] == stop and e["stop_reason"] == job["stop_reason"] for e in done), done
        # The stop step's loss is logged (off the log_every grid) and the final model written.
        assert max(e["step"] for e in evs if e["event"] == "loss") == stop
        cks = server.get(f"/v1/jobs/{jid}/checkpoints").json()
        assert cks["final"]["step"] == stop and cks["final"]["bytes"] > 0, cks
        assert server.get(f"/v1/jobs/{jid}/checkpoint").status_code == 200
    # `ddpd watch` says why it ended early (on stderr; stdout is the events).
    r = cli(server, "watch", str(jid))
    assert r.returncode == 0 and f"job {jid} succeeded: {job['stop_reason']}" in r.stderr, r.stderr
    # A job that runs to its end has no stop_reason.
    jid = server.submit(overfit_spec(steps=20))["id"]
    job = server.wait_state(jid, FINAL)
    assert job["state"] == "succeeded" and job["stop_reason"] is None, job


def test_early_stop_on_accuracy_with_mode_max(server):
    es = {"metric": "eval_accuracy", "mode": "max", "patience": 3}
    jid = server.submit(overfit_spec(early_stop=es, steps=300))["id"]
    job = server.wait_state(jid, FINAL, timeout=120)
    assert job["state"] == "succeeded", job
    evals = [(e["step"], e["accuracy"]) for e in server.events(jid) if e["event"] == "eval"]
    want = lightning_stop(evals, "max", 3, 0.0)
    assert want is not None and want[0] < 300, evals  # the accuracy stalls (0.625 at 55, 65 and 70)
    assert job["step"] == want[0], (job, evals)
    assert job["stop_reason"] == f"early_stopped at step {want[0]} (best {want[1]} = {want[2]:.6g})"


def test_keep_best_is_the_best_evals_checkpoint(server, work):
    kb = overfit_spec(name="kb", steps=100, checkpoint={"every_steps": 0, "keep_best": {"metric": "eval_loss"}})
    every = overfit_spec(name="every", steps=100, checkpoint={"every_steps": 5, "keep_last": 1000})
    a, b = server.submit(kb)["id"], server.submit(every)["id"]
    for j in (a, b):
        assert server.wait_state(j, FINAL, timeout=120)["state"] == "succeeded"
    evals = eval_losses(server, a)
    assert evals == eval_losses(server, b)  # the same run
    best_step = min(evals, key=lambda e: (e[1], e[0]))[0]  # the first of the lowest
    assert 5 < best_step < 100, evals
    cks = server.get(f"/v1/jobs/{a}/checkpoints").json()
    assert [c["step"] for c in cks["checkpoints"]] == [best_step], cks
    assert cks["checkpoints"][0]["best"] is True and cks["final"]["step"] == 100, cks
    # One best folder is left (each new best replaced the one before), outside keep_last.
    folder = server.jobs_dir / str(a)
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == [f"best-{best_step}"]
    wa, wb = weights(server, a, best_step), weights(server, b, best_step)
    assert sorted(wa) == sorted(wb) and all(np.array_equal(wa[k], wb[k]) for k in wa)
    assert any(not np.array_equal(wa[k], weights(server, b, best_step + 5)[k]) for k in wa)
    assert all(not c.get("best") for c in server.get(f"/v1/jobs/{b}/checkpoints").json()["checkpoints"])
    # The CLI: best and final in `checkpoints`, `pull --best`.
    r = cli(server, "checkpoints", str(a))
    assert r.returncode == 0, r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines()]
    assert rows[0] == ["STEP", "TIME", "BYTES", "KIND"], rows
    assert [(int(x[0]), x[-1]) for x in rows[1:]] == [(best_step, "best"), (100, "final")], rows
    out = work / "best.safetensors"
    r = cli(server, "pull", str(a), "--best", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == server.get(f"/v1/jobs/{a}/checkpoint", params={"step": best_step}).content
    e = server.get(f"/v1/jobs/{a}/checkpoint", params={"step": 7}).json()["error"]
    assert e["message"] == f"job {a} has no checkpoint at step 7; it has only its best one, at step {best_step}", e
    r = cli(server, "pull", str(b), "--best", "-o", str(work / "none.safetensors"))
    assert r.returncode == 1 and "has no best checkpoint" in r.stderr, r.stderr
    r = cli(server, "pull", str(a), "--best", "--step", "5")
    assert r.returncode == 2 and "--best" in r.stderr, r.stderr


def test_resume_mid_way_stops_at_the_same_step_with_the_same_best(make_server, work):
    # The job pauses after its checkpoint of step 40 (PausingWorker): after its best eval
    # (step ~35), with early_stop's wait counting, and long before its stop (patience 12:
    # step ~95), so it is cancelled mid-way however fast it trains. A resume that forgot
    # the watches' state would take a later eval as its best and stop later.
    paused = PausingWorker(work, at_step=40)
    server = make_server(cpu_slots=2, env=paused.env)
    es = {"metric": "eval_loss", "patience": 12}
    spec = overfit_spec(2, name="pausable", log_every=1, early_stop=es,
                        checkpoint={"every_steps": 10, "keep_last": 3, "keep_best": {"metric": "eval_loss"}})
    a = server.submit(spec)["id"]
    wait_until(lambda: any(c["step"] >= 40 and not c.get("best") for c in
                           server.get(f"/v1/jobs/{a}/checkpoints").json()["checkpoints"]), 60,
               f"job {a}'s checkpoint of step 40")
    assert server.post(f"/v1/jobs/{a}/cancel").status_code == 202
    assert server.wait_state(a, FINAL)["state"] == "cancelled"
    paused.release()
    r = cli(server, "resume", str(a))
    assert r.returncode == 0, r.stderr
    b = int(r.stdout.strip())
    jb = server.wait_state(b, FINAL, timeout=120)
    assert jb["state"] == "succeeded" and jb["resumed_from"] == a, jb
    best_a = [c["step"] for c in server.get(f"/v1/jobs/{a}/checkpoints").json()["checkpoints"] if c.get("best")]
    assert best_a and best_a[0] < 40 <= jb["resumed_from_step"] < jb["step"], (best_a, jb)
    ref = server.submit(dict(spec, name="uninterrupted"))["id"]
    jr = server.wait_state(ref, FINAL, timeout=120)
    assert jr["state"] == "succeeded" and "early_stopped" in jr["stop_reason"], jr
    assert (jb["step"], jb["stop_reason"]) == (jr["step"], jr["stop_reason"])
    best = [[c["step"] for c in server.get(f"/v1/jobs/{j}/checkpoints").json()["checkpoints"] if c.get("best")]
            for j in (b, ref)]
    assert best[0] == best[1] and len(best[0]) == 1, best
    wb, wr = weights(server, b, best[0][0]), weights(server, ref, best[1][0])
    assert all(np.array_equal(wb[k], wr[k]) for k in wr)
    # Resume's errors come back as the API's: a finished job, a step it does not have.
    r = cli(server, "resume", str(ref))
    assert r.returncode == 1 and "409" in r.stderr and "succeeded" in r.stderr, r.stderr
    r = cli(server, "resume", str(a), "--step", "7")
    assert r.returncode == 1 and "404" in r.stderr and "no checkpoint at step 7" in r.stderr, r.stderr
    r = cli(server, "resume", str(a), "--step", "x")
    assert r.returncode == 2 and "--step" in r.stderr, r.stderr


def test_jobs_shows_why_a_job_is_pending(make_server, work):
    server = make_server(cpu_slots=1)
    hog = server.submit(heavy_spec(1, steps=FOREVER_STEPS, name="hog"))["id"]
    server.wait_running(hog)
    waiting = server.submit(heavy_spec(1, steps=10, name="waiting"))["id"]
    why = wait_until(lambda: server.job(waiting)["pending_reason"], 30, "a pending reason")
    r = cli(server, "jobs")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    at = [i for i, ln in enumerate(lines) if ln.split()[0] == str(waiting)]
    assert at and lines[at[0] + 1].strip() == f"pending: {why}", r.stdout
    assert server.post(f"/v1/jobs/{hog}/cancel").status_code == 202
    assert server.wait_state(waiting, FINAL)["state"] == "succeeded"


def test_bad_watch_fields_are_422_naming_them(server, work):
    cases = [
        (dict(early_stop={"metric": "eval_los"}), "early_stop.metric"),
        (dict(early_stop={"metric": "eval_loss", "patience": -1}), "early_stop.patience"),
        (dict(early_stop={"metric": "eval_loss", "mode": "lower"}), "early_stop.mode"),
        (dict(early_stop={"metric": "eval_loss", "min_delta": "x"}), "early_stop.min_delta"),
        (dict(early_stop={"metric": "eval_loss", "wait": 3}), "early_stop.wait"),
        (dict(early_stop=3), "early_stop"),
        (dict(eval=None, early_stop={"metric": "eval_loss"}), "early_stop"),
        (dict(checkpoint={"keep_best": {"metric": "eval_loss", "patience": 2}}), "checkpoint.keep_best.patience"),
        (dict(eval=None, checkpoint={"keep_best": {"metric": "eval_loss"}}), "checkpoint.keep_best"),
        (dict(loss="mse", model=[{"type": "linear", "in": 8, "out": 4}],
              checkpoint={"keep_best": {"metric": "eval_accuracy"}}), "checkpoint.keep_best.metric"),
    ]
    for over, path in cases:
        spec = overfit_spec(**over)
        if spec.get("eval") is None:
            spec.pop("eval")
        r = server.post("/v1/jobs", json=spec)
        assert r.status_code == 422, (over, r.text)
        assert r.json()["error"]["path"] == path, (over, r.json())


def test_a_restart_from_before_the_best_writes_it_again(work):
    # A rank that died after writing best-35 but before ckpt-40 leaves a best checkpoint
    # newer than the one a restart resumes from (ckpt-30): the restart (here `ddpd run
    # --resume`, the same worker path) must write best-35 again, not fail on it.
    spec = overfit_spec(name="restart", steps=60, checkpoint={"every_steps": 10, "keep_last": 100,
                                                               "keep_best": {"metric": "eval_loss"}})
    (work / "s.json").write_text(json.dumps(spec))
    out = work / "out"
    r = subprocess.run([ddpd(), "run", "--out", str(out), str(work / "s.json")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    best = [p.name for p in out.iterdir() if p.name.startswith("best-")]
    assert len(best) == 1 and 30 < int(best[0][5:]) < 40, best  # the eval loss is lowest at 35
    before = st_decode((out / best[0] / "model.safetensors").read_bytes())[0]
    for name in ("ckpt-40", "ckpt-50"):
        shutil.rmtree(out / name)
    for f in out.glob("*.safetensors"):
        f.unlink()
    r = subprocess.run([ddpd(), "run", "--out", str(out), "--resume", str(out / "ckpt-30"), str(work / "s.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
    assert [p.name for p in out.iterdir() if p.name.startswith("best-")] == best
    after = st_decode((out / best[0] / "model.safetensors").read_bytes())[0]
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_resume_without_a_step_takes_the_best_checkpoint_when_it_is_the_newest(make_server, work):
    # keep_best alone (no every_steps): the best checkpoint is the only one, and a resume
    # continues from it with the numbers of the uninterrupted run.
    paused = PausingWorker(work, at_step=10)
    server = make_server(cpu_slots=1, env=paused.env)
    spec = overfit_spec(name="bestonly", steps=120, log_every=1,
                        checkpoint={"every_steps": 0, "keep_best": {"metric": "eval_loss"}})
    a = server.submit(spec)["id"]
    # A best at step 10 or later: the job then holds there (an earlier best, step 5 say, is
    # no sign that the pause has come: cancelled then, the job would end before step 10).
    wait_until(lambda: any(c["step"] >= 10 for c in server.get(f"/v1/jobs/{a}/checkpoints").json()["checkpoints"]),
               60, "a best checkpoint at step 10 or later")
    assert server.post(f"/v1/jobs/{a}/cancel").status_code == 202
    assert server.wait_state(a, FINAL)["state"] == "cancelled"
    paused.release()
    cks = server.get(f"/v1/jobs/{a}/checkpoints").json()["checkpoints"]
    assert len(cks) == 1 and cks[0]["best"] and cks[0]["step"] >= 10, cks
    r = server.post(f"/v1/jobs/{a}/resume")
    assert r.status_code == 201, r.text
    b = r.json()["id"]
    assert r.json()["resumed_from_step"] == cks[0]["step"]
    assert server.wait_state(b, FINAL, timeout=120)["state"] == "succeeded"
    ref = server.submit(dict(spec, name="uninterrupted"))["id"]
    assert server.wait_state(ref, FINAL, timeout=120)["state"] == "succeeded"

    def losses(j):
        return {e["step"]: e["loss"] for e in server.events(j) if e["event"] == "loss"}
    lb, lr = losses(b), losses(ref)
    assert min(lb) == cks[0]["step"] + 1 and max(lb) == 120, sorted(lb)[:3]
    assert {k: lr[k] for k in lb} == lb
