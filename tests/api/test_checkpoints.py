"""Checkpoints through the API (issue 19 part 3): the list of a job's checkpoints, the
download of one step's weights or optimizer state, resuming a failed or cancelled job
as a new job with the numbers of an uninterrupted run, and init.from_job."""
import os

import numpy as np

from pylib.server import FOREVER_STEPS, heavy_spec, seed_spec, st_decode

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
