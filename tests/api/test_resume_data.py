"""Resuming on data that changed since the checkpoint (issue 28 item 5). A checkpoint at
step 40,000 of a 300,000-window tokens file, resumed after the file had been replaced by a
12-window one, trained on silently "from step 40000 of the epoch". Checkpoints now record
each data file's fingerprint (size, modification time, samples, a SHA-256 of sampled
blocks: worker/fingerprint.h); POST /v1/jobs/{id}/resume has a planner compare the files
with it before the new job exists (409 data_changed naming the file and what changed,
unless ?force=true); every rank compares its own files again as it loads the checkpoint,
so a restart after a crash on a changed file fails the job, naming it. A file only touched
or copied (new mtime, same size and contents) resumes; so does a checkpoint written before
fingerprints were recorded, with a note in the rank's log."""
import json
import os
import re
import signal
import struct

import numpy as np

from pylib.server import FOREVER_STEPS, PausingWorker, seed_spec, wait_until

FINAL = ("succeeded", "failed", "cancelled")
META_KEY = "data_fingerprints"


def err_of(r, status):
    assert r.status_code == status, f"{r.status_code} {r.text}"
    return r.json()["error"]


def replace(path, data):
    """A new file renamed over the old one, as a user replaces a data file (a running
    rank's mapping keeps the old one)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def token_ids(n, seed):
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint16).tobytes()


def tokens_job(data_dir, **over):
    """A tiny GPT on a tokens file of 65,536 ids: 4,095 windows of 16."""
    path = data_dir / "train.bin"
    path.write_bytes(token_ids(1 << 16, 1))
    spec = seed_spec(model=[{"type": "embedding", "num": 256, "dim": 8},
                            {"type": "position", "max": 16, "dim": 8},
                            {"type": "linear", "in": 8, "out": 256}],
                     input_shape=[16], loss="cross_entropy", batch_size=4, name="tokens", epochs=None,
                     steps=FOREVER_STEPS, log_every=50, checkpoint={"every_steps": 50},
                     data={"type": "tokens", "path": "train.bin", "block_size": 16})
    spec.update(over)
    return spec, path


def npy_job(data_dir, **over):
    """A linear model on x.npy [200, 10] and y.npy [200, 1]."""
    rng = np.random.default_rng(3)
    np.save(data_dir / "x.npy", rng.standard_normal((200, 10)).astype(np.float32))
    np.save(data_dir / "y.npy", rng.standard_normal((200, 1)).astype(np.float32))
    spec = seed_spec(model=[{"type": "linear", "in": 10, "out": 1}], batch_size=4, name="npy", epochs=None,
                     steps=FOREVER_STEPS, log_every=50, checkpoint={"every_steps": 50}, world_size=1,
                     data={"type": "npy", "x": "x.npy", "y": "y.npy"})
    spec.update(over)
    return spec, data_dir / "x.npy"


def cancelled_after_a_checkpoint(srv, spec):
    """Runs the job until it has a checkpoint, cancels it: (job id, its newest step)."""
    a = srv.submit(spec)["id"]
    wait_until(lambda: srv.get(f"/v1/jobs/{a}/checkpoints").json()["checkpoints"], 60, f"job {a}'s checkpoint")
    assert srv.post(f"/v1/jobs/{a}/cancel").status_code == 202
    assert srv.wait_state(a, FINAL)["state"] == "cancelled"
    return a, srv.get(f"/v1/jobs/{a}/checkpoints").json()["checkpoints"][-1]["step"]


def rank_log(srv, jid, rank=0):
    return (srv.jobs_dir / str(jid) / f"rank-{rank}.log").read_text(errors="replace")


def trains_on_then_cancel(srv, jid, after):
    """The resumed job trains past its checkpoint; then it is cancelled."""
    wait_until(lambda: (srv.job(jid)["step"] or 0) > after, 60, f"job {jid} past step {after}")
    assert srv.post(f"/v1/jobs/{jid}/cancel").status_code == 202
    assert srv.wait_state(jid, FINAL)["state"] == "cancelled"


def header(path):
    buf = path.read_bytes()
    (n,) = struct.unpack("<Q", buf[:8])
    return json.loads(buf[8:8 + n]), buf[8 + n:]


def test_a_shorter_tokens_file_is_refused_naming_it_unless_forced(server):
    spec, path = tokens_job(server.data_dir)
    a, step = cancelled_after_a_checkpoint(server, spec)
    size = path.stat().st_size
    # The checkpoint's record: the file as the job read it.
    meta = header(server.jobs_dir / str(a) / f"ckpt-{step}" / "model.safetensors")[0]["__metadata__"]
    files = json.loads(meta[META_KEY])["files"]
    assert [(f["field"], f["file"], f["bytes"], f["samples"], f["unit"]) for f in files] == \
        [("data.path", "train.bin", size, 4095, "windows")], files
    assert re.fullmatch(r"[0-9a-f]{64}", files[0]["sha256"]), files

    replace(path, token_ids(193, 2))  # 12 windows of 16
    jobs = len(server.get("/v1/jobs").json()["jobs"])
    e = err_of(server.post(f"/v1/jobs/{a}/resume"), 409)
    assert e["code"] == "data_changed" and e["path"] == "data.path", e
    assert e["message"] == (f'data.path "train.bin" changed since the checkpoint at step {step}: size {size} → 386 '
                            "bytes, windows 4095 → 12; to train on the data as it is now, resume with force"), e
    assert len(server.get("/v1/jobs").json()["jobs"]) == jobs, "a refused resume made a job"
    e = err_of(server.post(f"/v1/jobs/{a}/resume?force=maybe"), 400)
    assert e["path"] == "force", e

    # force: the new job trains on the file as it is now, and its log says what changed.
    r = server.post(f"/v1/jobs/{a}/resume?force=true")
    assert r.status_code == 201, r.text
    b = r.json()["id"]
    assert r.json()["resumed_from"] == a and r.json()["resumed_from_step"] == step
    trains_on_then_cancel(server, b, step)
    log = rank_log(server, b)
    assert (f'warning: data.path "train.bin" changed since the checkpoint at step {step}: size {size} → 386 bytes, '
            "windows 4095 → 12; resuming on the data as it is now (force)") in log, log
    # The new job's own checkpoints record the data it trained on.
    c = server.get(f"/v1/jobs/{b}/checkpoints").json()["checkpoints"][-1]["step"]
    meta = header(server.jobs_dir / str(b) / f"ckpt-{c}" / "model.safetensors")[0]["__metadata__"]
    assert [(f["bytes"], f["samples"]) for f in json.loads(meta[META_KEY])["files"]] == [(386, 12)], meta


def test_npy_of_the_same_size_with_other_values_is_refused(server):
    spec, x = npy_job(server.data_dir)
    a, step = cancelled_after_a_checkpoint(server, spec)
    size = x.stat().st_size
    tmp = x.with_name("x2.npy")
    np.save(tmp, np.random.default_rng(4).standard_normal((200, 10)).astype(np.float32))
    os.replace(tmp, x)
    assert x.stat().st_size == size
    e = err_of(server.post(f"/v1/jobs/{a}/resume"), 409)
    assert e["code"] == "data_changed" and e["path"] == "data.x", e
    assert e["message"].startswith(
        f'data.x "x.npy" changed since the checkpoint at step {step}: same size ({size} bytes) and rows (200) but '
        "different contents"), e


def test_a_touched_or_copied_file_resumes(server):
    spec, x = npy_job(server.data_dir)
    a, step = cancelled_after_a_checkpoint(server, spec)
    # A copy (a new file, a new modification time) with the same bytes.
    data = x.read_bytes()
    replace(x, data)
    st = x.stat()
    os.utime(x, ns=(st.st_atime_ns, st.st_mtime_ns + 3_600_000_000_000))
    r = server.post(f"/v1/jobs/{a}/resume")
    assert r.status_code == 201, r.text
    b = r.json()["id"]
    trains_on_then_cancel(server, b, step)
    log = rank_log(server, b)
    assert (f'data.x "x.npy" was modified or renamed since the checkpoint at step {step} (modification time or '
            "name), but its size, rows and sampled contents are the same: taken as the same data") in log, log


def test_a_restart_after_a_crash_on_a_changed_file_fails_naming_it(make_server, work):
    # The job pauses after its first checkpoint, so its rank is killed mid-run however fast
    # it trains; its restart finds the tokens file replaced by a shorter one.
    paused = PausingWorker(work, at_step=50)
    srv = make_server(cpu_slots=1, env=paused.env)
    spec, path = tokens_job(srv.data_dir, max_restarts=1)
    jid = srv.submit(spec)["id"]
    wait_until(lambda: srv.get(f"/v1/jobs/{jid}/checkpoints").json()["checkpoints"], 60, "a checkpoint")
    # Paused: running until the kill (its start event may reach the server after the
    # checkpoint reached the disk).
    j = srv.wait_running(jid)
    assert j["attempt"] == 1, j
    size = path.stat().st_size
    replace(path, token_ids(193, 2))
    os.kill(j["ranks"][0]["pid"], signal.SIGKILL)
    paused.release()
    j = srv.wait_state(jid, FINAL, timeout=120)
    assert j["state"] == "failed" and j["attempt"] == 2, j
    m = re.fullmatch(r'rank 0 failed \(exit code 2\): data\.path "train\.bin" changed since the checkpoint at step '
                     rf"(\d+): size {size} → 386 bytes, windows 4095 → 12; to train on the data as it is now, "
                     r"resume with force", j["error"])
    assert m, j["error"]
    errs = [e for e in srv.events(jid) if e["event"] == "error" and e.get("attempt") == 2]
    assert [(e["kind"], e["rank"]) for e in errs] == [("data", 0)], errs
    assert not [e for e in srv.events(jid) if e["event"] == "loss" and e.get("attempt") == 2], \
        "the restarted attempt trained on the changed file"


def test_a_checkpoint_without_fingerprints_still_resumes(server):
    """A checkpoint written before they were recorded: the resume goes on, and the rank's
    log says the data could not be checked."""
    spec, x = npy_job(server.data_dir)
    a, step = cancelled_after_a_checkpoint(server, spec)
    for f in (server.jobs_dir / str(a)).glob("ckpt-*/*.safetensors"):
        hdr, body = header(f)
        assert META_KEY in hdr["__metadata__"], f
        del hdr["__metadata__"][META_KEY]
        h = json.dumps(hdr, separators=(",", ":")).encode()
        h += b" " * ((-len(h)) % 8)
        f.write_bytes(struct.pack("<Q", len(h)) + h + body)
    # Changed data goes unseen then: that is what "could not be checked" means.
    np.save(x, np.zeros((200, 10), dtype=np.float32))
    r = server.post(f"/v1/jobs/{a}/resume")
    assert r.status_code == 201, r.text
    b = r.json()["id"]
    trains_on_then_cancel(server, b, step)
    log = rank_log(server, b)
    assert (f"the checkpoint at step {step} records no data fingerprints (written before ddpd recorded them): its "
            "data files could not be checked against it") in log, log


def test_a_forced_resume_of_a_job_started_from_another_jobs_weights(server):
    """A resume starts from its checkpoint, never from init.from_job, which the resume's
    data check therefore leaves alone, with force too."""
    spec, x = npy_job(server.data_dir)
    base = server.submit(dict(spec, name="base", steps=5, checkpoint={"every_steps": 0}))["id"]
    assert server.wait_state(base, FINAL)["state"] == "succeeded"
    a, step = cancelled_after_a_checkpoint(server, dict(spec, init={"from_job": base}))
    np.save(x, np.ones((200, 10), dtype=np.float32))
    assert err_of(server.post(f"/v1/jobs/{a}/resume"), 409)["path"] == "data.x"
    r = server.post(f"/v1/jobs/{a}/resume?force=true")
    assert r.status_code == 201, r.text
    trains_on_then_cancel(server, r.json()["id"], step)
