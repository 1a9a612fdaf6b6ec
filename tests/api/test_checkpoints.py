"""Checkpoints through the API (issue 19 part 3): the list of a job's checkpoints, the
download of one step's weights or optimizer state, resuming a failed or cancelled job
as a new job with the numbers of an uninterrupted run, and init.from_job."""
import os
import signal

import numpy as np

from pylib.server import FOREVER_STEPS, PausingWorker, heavy_spec, seed_spec, st_decode, wait_until

FINAL = ("succeeded", "failed", "cancelled")


def err_of(r, status):
    assert r.status_code == status, f"{r.status_code} {r.text}"
    return r.json()["error"]


def small_spec(**over):
    return seed_spec(**dict(dict(name="ck", world_size=1, epochs=None, steps=30, log_every=1,
                                 checkpoint={"every_steps": 10}), **over))


def test_list_and_download_by_step(server):
    jid = server.submit(small_spec())["id"]
    assert server.wait_state(jid, FINAL)["state"] == "succeeded"
    r = server.get(f"/v1/jobs/{jid}/checkpoints")
    assert r.status_code == 200, r.text
    cks = r.json()["checkpoints"]
    # The last step writes the final model (in the job folder), not a ckpt-30.
    assert [c["step"] for c in cks] == [10, 20], cks
    times = [c["time"] for c in cks]
    assert times == sorted(times) and all(isinstance(t, float) and t > 1e9 for t in times), cks
    for c in cks:
        d = server.jobs_dir / str(jid) / f"ckpt-{c['step']}"
        assert c["bytes"] == sum(f.stat().st_size for f in d.iterdir()), (c, list(d.iterdir()))
    # One step's weights and its optimizer state, as written in the job's folder.
    for step in (10, 20):
        r = server.get(f"/v1/jobs/{jid}/checkpoint?step={step}")
        assert r.status_code == 200, r.text
        assert 'filename="model.safetensors"' in r.headers["Content-Disposition"]
        d = server.jobs_dir / str(jid) / f"ckpt-{step}"
        assert r.content == (d / "model.safetensors").read_bytes()
        r = server.get(f"/v1/jobs/{jid}/checkpoint?step={step}&file=optim")
        assert r.status_code == 200, r.text
        assert 'filename="optim.safetensors"' in r.headers["Content-Disposition"]
        assert r.content == (d / "optim.safetensors").read_bytes()
    w10 = st_decode(server.get(f"/v1/jobs/{jid}/checkpoint?step=10").content)[0]
    w20 = st_decode(server.get(f"/v1/jobs/{jid}/checkpoint?step=20").content)[0]
    assert any(not np.array_equal(w10[k], w20[k]) for k in w10), "two steps' weights should differ"
    # Without a step: the final model, as before.
    r = server.get(f"/v1/jobs/{jid}/checkpoint")
    assert r.content == (server.jobs_dir / str(jid) / "model.safetensors").read_bytes()
    # A step that does not exist names the ones that do.
    e = err_of(server.get(f"/v1/jobs/{jid}/checkpoint?step=7"), 404)
    assert e["message"] == f"job {jid} has no checkpoint at step 7; it has steps 10, 20", e
    assert e["path"] == "step", e
    e = err_of(server.get(f"/v1/jobs/{jid}/checkpoint?step=10&file=grads"), 400)
    assert "file" in e["message"], e
    e = err_of(server.get(f"/v1/jobs/{jid}/checkpoint?step=x"), 400)
    assert "step" in e["message"], e
    assert err_of(server.get("/v1/jobs/999999/checkpoints"), 404)


def test_list_of_a_job_without_checkpoints_is_empty(server):
    jid = server.submit(heavy_spec(1, steps=FOREVER_STEPS, name="none"))["id"]
    server.wait_running(jid)
    assert server.get(f"/v1/jobs/{jid}/checkpoints").json() == {"checkpoints": []}
    assert server.post(f"/v1/jobs/{jid}/cancel").status_code == 202
    assert server.wait_state(jid, FINAL)["state"] == "cancelled"
    e = err_of(server.get(f"/v1/jobs/{jid}/checkpoint"), 404)
    assert e["message"] == f"job {jid} has no checkpoint: it was cancelled before its first checkpoint", e
    e = err_of(server.get(f"/v1/jobs/{jid}/checkpoint?step=5"), 404)
    assert e["message"] == f"job {jid} has no checkpoint at step 5; it has none", e


def losses(server, jid):
    return {(e["rank"], e["step"]): e["loss"] for e in server.events(jid) if e["event"] == "loss"}


def test_resume_a_cancelled_job_gives_the_numbers_of_an_uninterrupted_run(make_server, work):
    # Job a pauses after its first checkpoint, so it is cancelled mid-run however fast
    # the ranks train; the resumed job and the reference run unpaused.
    paused = PausingWorker(work, at_step=500)
    server = make_server(cpu_slots=2, env=paused.env)
    spec = heavy_spec(2, steps=6000, name="resumable", checkpoint={"every_steps": 500, "keep_last": 2},
                      log_every=10)
    a = server.submit(spec)["id"]
    wait_until(lambda: server.get(f"/v1/jobs/{a}/checkpoints").json()["checkpoints"], 60,
               f"job {a}'s first checkpoint")
    assert server.post(f"/v1/jobs/{a}/cancel").status_code == 202
    assert server.wait_state(a, FINAL)["state"] == "cancelled"
    paused.release()
    steps = [c["step"] for c in server.get(f"/v1/jobs/{a}/checkpoints").json()["checkpoints"]]
    r = server.post(f"/v1/jobs/{a}/resume")
    assert r.status_code == 201, r.text
    b = r.json()
    assert b["resumed_from"] == a and b["resumed_from_step"] == steps[-1] and b["state"] == "queued", b
    assert r.headers["Location"] == f"/v1/jobs/{b['id']}"
    assert b["spec"] == server.job(a)["spec"]
    jb = server.wait_state(b["id"], FINAL, timeout=120)
    assert jb["state"] == "succeeded", jb["error"]
    assert jb["resumed_from"] == a and jb["resumed_from_step"] == steps[-1], jb
    # The cancelled job stays as it was, its checkpoints with it.
    assert server.job(a)["state"] == "cancelled"
    assert [c["step"] for c in server.get(f"/v1/jobs/{a}/checkpoints").json()["checkpoints"]] == steps

    ref = server.submit(dict(spec, name="uninterrupted"))["id"]
    assert server.wait_state(ref, FINAL, timeout=120)["state"] == "succeeded"
    lb, lref = losses(server, b["id"]), losses(server, ref)
    assert lb and min(s for _, s in lb) > steps[-1], sorted(lb)[:3]
    assert max(s for _, s in lb) == 6000
    # Exactly the numbers: every loss the resumed job logged, and the final weights.
    assert {k: lref[k] for k in lb} == lb
    wb = st_decode(server.get(f"/v1/jobs/{b['id']}/checkpoint").content)[0]
    wref = st_decode(server.get(f"/v1/jobs/{ref}/checkpoint").content)[0]
    assert wb.keys() == wref.keys()
    for k in wref:
        np.testing.assert_array_equal(wb[k], wref[k], err_msg=f"resumed vs uninterrupted: {k}")

    # From an older step, chosen with ?step=.
    r = server.post(f"/v1/jobs/{a}/resume?step={steps[0]}")
    assert r.status_code == 201, r.text
    assert r.json()["resumed_from_step"] == steps[0]
    assert server.wait_state(r.json()["id"], FINAL, timeout=120)["state"] == "succeeded"
    first = min(s for _, s in losses(server, r.json()["id"]))
    assert steps[0] < first <= steps[0] + 10, first


def test_resume_refusals(server):
    done = server.submit(small_spec(name="done"))["id"]
    assert server.wait_state(done, FINAL)["state"] == "succeeded"
    e = err_of(server.post(f"/v1/jobs/{done}/resume"), 409)
    assert e["message"].startswith(f"job {done} is succeeded: only a failed or cancelled job can be resumed"), e
    run = server.submit(heavy_spec(1, steps=FOREVER_STEPS, name="running"))["id"]
    server.wait_running(run)
    e = err_of(server.post(f"/v1/jobs/{run}/resume"), 409)
    assert "is running" in e["message"] and "it has not ended" in e["message"], e
    assert server.post(f"/v1/jobs/{run}/cancel").status_code == 202
    assert server.wait_state(run, FINAL)["state"] == "cancelled"
    e = err_of(server.post(f"/v1/jobs/{run}/resume"), 404)
    assert e["message"] == (f"job {run} has no checkpoint to resume from: it was cancelled before its first "
                            "checkpoint (checkpoint.every_steps)"), e
    e = err_of(server.post(f"/v1/jobs/{run}/resume?step=3"), 404)
    assert e["message"] == f"job {run} has no checkpoint at step 3; it has none" and e["path"] == "step", e
    assert err_of(server.post("/v1/jobs/999999/resume"), 404)
    assert server.job(done)["resumed_from"] is None


def test_resume_of_a_deleted_jobs_checkpoint_fails_the_new_job_saying_so(make_server):
    srv = make_server(cpu_slots=1)
    a = srv.submit(heavy_spec(1, steps=FOREVER_STEPS, name="a", checkpoint={"every_steps": 50}))["id"]
    wait_until(lambda: srv.get(f"/v1/jobs/{a}/checkpoints").json()["checkpoints"], 60, "a checkpoint")
    assert srv.post(f"/v1/jobs/{a}/cancel").status_code == 202
    assert srv.wait_state(a, FINAL)["state"] == "cancelled"
    # The one slot is busy, so the resumed job waits while its source is deleted.
    busy = srv.submit(heavy_spec(1, steps=FOREVER_STEPS, name="busy"))["id"]
    srv.wait_running(busy)
    r = srv.post(f"/v1/jobs/{a}/resume")
    assert r.status_code == 201, r.text
    step = r.json()["resumed_from_step"]
    assert srv.delete(f"/v1/jobs/{a}").status_code == 204
    assert srv.post(f"/v1/jobs/{busy}/cancel").status_code == 202
    j = srv.wait_state(r.json()["id"], FINAL)
    assert j["state"] == "failed", j
    assert f"job {a}'s checkpoint at step {step} to resume from: it is gone" in j["error"], j["error"]


def test_init_from_job_starts_from_another_jobs_weights(server):
    a = server.submit(small_spec(name="base"))["id"]
    assert server.wait_state(a, FINAL)["state"] == "succeeded"
    # lr 1e-30 leaves every weight as it was (in float32), so the fine-tuned job's final
    # model is exactly the weights it started from.
    tiny = {"type": "sgd", "lr": 1e-30}
    for init, src in (({"from_job": a}, f"{a}/model.safetensors"),
                      ({"from_job": a, "step": 10}, f"{a}/ckpt-10/model.safetensors")):
        b = server.submit(small_spec(name="tuned", steps=5, checkpoint=None, optimizer=tiny, init=init))
        assert b["spec"]["init"] == init, b["spec"]
        jb = server.wait_state(b["id"], FINAL)
        assert jb["state"] == "succeeded", jb["error"]
        got = st_decode(server.get(f"/v1/jobs/{b['id']}/checkpoint").content)[0]
        want = st_decode((server.jobs_dir / src).read_bytes())[0]
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{init}: {k}")
    w10 = st_decode((server.jobs_dir / f"{a}/ckpt-10/model.safetensors").read_bytes())[0]
    wfin = st_decode((server.jobs_dir / f"{a}/model.safetensors").read_bytes())[0]
    assert any(not np.array_equal(w10[k], wfin[k]) for k in w10)


def test_init_from_job_errors(server):
    a = server.submit(small_spec(name="base"))["id"]
    assert server.wait_state(a, FINAL)["state"] == "succeeded"

    def refused(init, path, **over):
        r = server.post("/v1/jobs", json=small_spec(init=init, **over))
        e = err_of(r, 422)
        assert e["path"] == path, e
        return e["message"]

    assert refused({"from_job": 999999}, "init.from_job") == "init.from_job: there is no job 999999"
    assert refused({"from_job": a, "step": 7}, "init.step") == (
        f"init.step: job {a} has no checkpoint at step 7; it has steps 10, 20")
    m = refused({"from_job": a}, "init.from_job",
                model=[{"type": "linear", "in": 10, "out": 4}])
    assert f"job {a}'s weights" in m and "shape" in m and "[4, 10]" in m, m
    assert "from_job" in refused({"seed": 1, "step": 3}, "init.step")
    assert "not two" in refused({"seed": 1, "from_job": a}, "init.from_job")
    assert refused({"from_job": 0}, "init.from_job")
    # A job with no weights yet.
    q = server.submit(heavy_spec(1, steps=FOREVER_STEPS, name="busy"))["id"]
    server.wait_running(q)
    m = refused({"from_job": q}, "init.from_job")
    assert m == f"init.from_job: job {q} (running) has no weights yet: no final model and no checkpoint", m
    assert server.post(f"/v1/jobs/{q}/cancel").status_code == 202
    server.wait_state(q, FINAL)


def test_resume_a_failed_job(server):
    spec = heavy_spec(1, steps=FOREVER_STEPS, name="dies", checkpoint={"every_steps": 1000},
                      log_every=100)
    a = server.submit(spec)["id"]
    j = server.wait_running(a)
    wait_until(lambda: server.get(f"/v1/jobs/{a}/checkpoints").json()["checkpoints"], 60, "a checkpoint")
    os.kill(j["ranks"][0]["pid"], signal.SIGKILL)
    assert server.wait_state(a, FINAL)["state"] == "failed"
    r = server.post(f"/v1/jobs/{a}/resume")
    assert r.status_code == 201, r.text
    b = r.json()["id"]
    server.wait_running(b)
    wait_until(lambda: (server.job(b)["step"] or 0) > r.json()["resumed_from_step"], 60, "a step after the checkpoint")
    assert server.post(f"/v1/jobs/{b}/cancel").status_code == 202
    assert server.wait_state(b, FINAL)["state"] == "cancelled"


def test_a_queued_resumed_job_keeps_its_link_across_a_server_restart(make_server):
    srv = make_server(cpu_slots=1)
    a = srv.submit(heavy_spec(1, steps=FOREVER_STEPS, name="a", checkpoint={"every_steps": 500},
                              log_every=100))["id"]
    wait_until(lambda: srv.get(f"/v1/jobs/{a}/checkpoints").json()["checkpoints"], 60, "a checkpoint")
    assert srv.post(f"/v1/jobs/{a}/cancel").status_code == 202
    assert srv.wait_state(a, FINAL)["state"] == "cancelled"
    busy = srv.submit(heavy_spec(1, steps=FOREVER_STEPS, name="busy"))["id"]
    srv.wait_running(busy)
    r = srv.post(f"/v1/jobs/{a}/resume")
    assert r.status_code == 201, r.text
    b, step = r.json()["id"], r.json()["resumed_from_step"]
    assert srv.stop() == 0  # the running job is cancelled, the queued one stays queued
    srv.start()
    jb = srv.job(b)
    assert jb["resumed_from"] == a and jb["resumed_from_step"] == step, jb
    wait_until(lambda: (srv.job(b)["step"] or 0) > step, 60, "a step after the checkpoint")
    assert srv.post(f"/v1/jobs/{b}/cancel").status_code == 202
    assert srv.wait_state(b, FINAL)["state"] == "cancelled"
    first = min(e["step"] for e in srv.events(b) if e["event"] == "loss")
    assert step < first <= step + 100, (step, first)
