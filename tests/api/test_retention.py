"""Retention (issue 15, item 11): checkpoints are pruned to `checkpoint.keep_last` (the
final model always stays), a --resume of a pruned step fails with a sentence naming what
is left, a restart still resumes from the newest checkpoint, and `ddpd serve
--job-disk-quota` stops a job whose folder would hold more: before rank 0 writes a
checkpoint that would not fit (nothing of it is written), and when the supervisor finds the
folder over it (a rank that logs without end). Before: every checkpoint stayed forever
(`every_steps: 1` wrote 577 MB in 3 s) and nothing bounded a job's folder."""
import json
import os
import re
import subprocess
import time

import pytest

from pylib.server import FOREVER_STEPS, bin_dir, heavy_spec, seed_spec, st_decode, wait_until

FINAL = ("succeeded", "failed", "cancelled")


def tiny_spec(**over):
    """1 rank, 10-16-5 MLP with SGD momentum (so optimizer state matters on resume)."""
    s = seed_spec(name="keep", epochs=None, steps=20, log_every=1,
                  model=[{"type": "linear", "in": 10, "out": 16}, {"type": "relu"},
                         {"type": "linear", "in": 16, "out": 5}],
                  optimizer={"type": "sgd", "lr": 0.01, "momentum": 0.9},
                  data={"type": "synthetic", "samples": 400, "seed": 3}, batch_size=8)
    for k, v in over.items():
        if v is None:
            s.pop(k, None)
        else:
            s[k] = v
    return s


def ckpt_dirs(folder):
    """The complete checkpoints: ckpt-N, not ckpt-N.tmp (being written) or ckpt-N.del."""
    return sorted((p.name for p in folder.iterdir() if re.fullmatch(r"ckpt-\d+", p.name)),
                  key=lambda n: (len(n), n))


def whole_checkpoint(d):
    """Both files there and their headers parse (a torn file would not)."""
    for f in ("model.safetensors", "optim.safetensors"):
        st_decode((d / f).read_bytes())
    return True


def folder_bytes(folder):
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def ddpd_run(*args, timeout=120):
    return subprocess.run([str(bin_dir() / "ddpd"), "run", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_keep_last_leaves_the_last_checkpoints_and_the_final_model(server, work):
    spec = tiny_spec(checkpoint={"every_steps": 1, "keep_last": 2})
    jid = server.submit(spec)["id"]
    j = server.wait_state(jid, FINAL, timeout=120)
    assert j["state"] == "succeeded", j
    assert j["spec"]["checkpoint"] == {"every_steps": 1, "keep_last": 2}, j["spec"]
    folder = server.jobs_dir / str(jid)
    # Exactly the last 2 checkpoint folders (20 is the final model, not a folder) + the final model.
    assert ckpt_dirs(folder) == ["ckpt-18", "ckpt-19"], sorted(os.listdir(folder))
    assert sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix == ".safetensors") == [
        "model.safetensors", "optim.safetensors"]
    assert all(whole_checkpoint(folder / d) for d in ("ckpt-18", "ckpt-19"))
    # Every checkpoint was announced as it was written: 19 folders and the final model.
    evs = server.events(jid)
    assert [e["step"] for e in evs if e["event"] == "checkpoint"] == list(range(1, 21))

    # Resuming from the last checkpoint gives exactly the uninterrupted run's weights.
    out = work / "resumed"
    (work / "spec.json").write_text(json.dumps(spec))
    r = ddpd_run("--out", out, "--resume", folder / "ckpt-19", work / "spec.json")
    assert r.returncode == 0, r.stderr
    want = st_decode((folder / "model.safetensors").read_bytes())[0]
    got = st_decode((out / "model.safetensors").read_bytes())[0]
    assert sorted(want) == sorted(got)
    for k in want:
        assert (want[k] == got[k]).all(), f"{k} differs after resuming from ckpt-19"

    # A pruned step cannot be resumed: the error says why and names what is left.
    r = ddpd_run("--out", work / "pruned", "--resume", folder / "ckpt-5", work / "spec.json")
    assert r.returncode == 2, (r.returncode, r.stderr)
    msg = r.stderr
    assert f"{folder}/ckpt-5: no such checkpoint" in msg and "checkpoint.keep_last" in msg, msg
    assert f"{folder}/ckpt-19, {folder}/ckpt-18" in msg, msg


def test_keep_last_default_under_join_and_ddpd_run(work):
    """The variant: the default keep_last (3), 2 uneven ranks (join: checkpoints after
    shadowed steps too), through `ddpd run` without a server."""
    if bin_dir() is None:
        pytest.skip("ddpd is not built (set DDPD_BIN to the build folder)")
    spec = tiny_spec(world_size=2, steps=None, epochs=2, data={"type": "synthetic", "samples": 201, "seed": 3},
                     batch_size=4, checkpoint={"every_steps": 5})
    (work / "spec.json").write_text(json.dumps(spec))
    out = work / "out"
    r = ddpd_run("--world-size", 2, "--out", out, work / "spec.json")
    assert r.returncode == 0, r.stderr
    evs = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    steps = [e["step"] for e in evs if e["event"] == "checkpoint" and "/ckpt-" in e["path"]]
    assert len(steps) > 3, steps  # 2 epochs of 26 steps: 10 checkpoints, 7 of them pruned
    assert ckpt_dirs(out) == [f"ckpt-{s}" for s in steps[-3:]], (steps, sorted(os.listdir(out)))
    assert all(whole_checkpoint(out / d) for d in ckpt_dirs(out))
    assert (out / "model.safetensors").exists()


@pytest.mark.parametrize("keep, fragment", [
    (0, "expected a positive integer, got 0"),
    (-1, "expected a positive integer, got -1"),
    ("3", "expected a positive integer, got \"3\""),
    (1.5, "expected a positive integer, got 1.5"),
])
def test_invalid_keep_last_is_422(server, keep, fragment):
    r = server.post("/v1/jobs", json=tiny_spec(checkpoint={"every_steps": 1, "keep_last": keep}))
    assert r.status_code == 422, r.text
    e = r.json()["error"]
    assert e["path"] == "checkpoint.keep_last" and fragment in e["message"], e


def test_restart_resumes_from_the_newest_checkpoint_after_pruning(server):
    """A rank killed mid-run: the restart finds the newest of the pruned set."""
    # The job runs until the test cancels it once the restart has resumed. A checkpoint
    # every 5000 steps: some a second whatever the machine's speed (each is fsynced and
    # prunes one; a checkpoint every 7 steps was ~700 a job, which a loaded machine took
    # minutes for).
    every = 5000
    spec = heavy_spec(1, steps=FOREVER_STEPS, name="restart", max_restarts=1, log_every=1000,
                      checkpoint={"every_steps": every, "keep_last": 2})
    jid = server.submit(spec)["id"]
    j = server.wait_running(jid)
    folder = server.jobs_dir / str(jid)
    wait_until(lambda: len(ckpt_dirs(folder)) >= 2 and any(int(d[5:]) > 2 * every for d in ckpt_dirs(folder)),
               120, f"two checkpoints beyond step {2 * every}")
    pid = j["ranks"][0]["pid"]
    os.kill(pid, 9)
    before = ckpt_dirs(folder)
    wait_until(lambda: "resumed from" in (folder / "rank-0.log").read_text(), 120, "the restart to resume")
    # The rank logs its resume before its `start` event reaches the supervisor, which is
    # what makes the attempt `running`: a loaded machine shows `starting` in between.
    wait_until(lambda: server.job(jid)["state"] == "running", 120, "the restarted attempt to run")
    j = server.job(jid)
    assert j["state"] == "running" and j["attempt"] == 2 and j["restarts"] == 1, j
    assert server.post(f"/v1/jobs/{jid}/cancel").status_code == 202
    j = server.wait_state(jid, FINAL, timeout=120)
    assert j["state"] == "cancelled" and j["restarts"] == 1, j
    log = (folder / "rank-0.log").read_text()
    resumed = [l for l in log.splitlines() if "resumed from" in l]
    assert len(resumed) == 1, log[-2000:]
    step = int(resumed[0].split("/ckpt-")[1].split()[0])
    # The newest whole checkpoint when the rank died (a later one may have been renamed
    # into place between the listing and the kill).
    assert step >= max(int(d[5:]) for d in before if not d.endswith((".tmp", ".del"))), (resumed, before)
    assert len(ckpt_dirs(folder)) == 2, ckpt_dirs(folder)


def test_quota_exceeded_by_a_checkpoint_fails_the_job_and_writes_nothing(make_server):
    quota = 96 * 1024
    srv = make_server(cpu_slots=1, extra=["--job-disk-quota", "96K"])
    # 10-256-5 with momentum: a checkpoint is ~2 x 14 KiB; keep_last 10 lets the folder grow.
    spec = heavy_spec(1, steps=500, name="quota", optimizer={"type": "sgd", "lr": 0.01, "momentum": 0.9},
                      checkpoint={"every_steps": 10, "keep_last": 10})
    jid = srv.submit(spec)["id"]
    j = srv.wait_state(jid, FINAL, timeout=120)
    assert j["state"] == "failed", j
    folder = srv.jobs_dir / str(jid)
    err = j["error"]
    assert "rank 0 failed (exit code 1)" in err, err
    assert f"over the job disk quota of {quota} bytes (ddpd serve --job-disk-quota)" in err, err
    # The API writes the server's folders as a client knows them: jobs/ID.
    assert f"the job folder jobs/{jid} " in err and "nothing was written" in err, err
    assert "writing checkpoint ckpt-" in err, err
    # Nothing of the refused checkpoint, nothing after it; the folder is within the quota.
    cks = ckpt_dirs(folder)
    assert cks and not any(d.endswith(".tmp") for d in cks), cks
    refused = int(err.split("writing checkpoint ckpt-")[1].split()[0])
    assert max(int(d[5:]) for d in cks) == refused - 10, (cks, refused)
    assert not (folder / "model.safetensors").exists()
    assert folder_bytes(folder) <= quota
    evs = srv.events(jid)
    assert [e for e in evs if e["event"] == "error" and "job disk quota" in e["message"]], evs[-5:]
    assert max(e["step"] for e in evs if e["event"] == "loss") == refused
    print(f"job error: {err}; folder {folder_bytes(folder)} bytes")


def test_quota_reached_by_the_final_model_fails_the_job(make_server):
    """The variant: no periodic checkpoints; the final model alone does not fit."""
    srv = make_server(cpu_slots=1, extra=["--job-disk-quota", "20k"])
    spec = heavy_spec(1, steps=20, name="final", optimizer={"type": "adamw"})
    jid = srv.submit(spec)["id"]
    j = srv.wait_state(jid, FINAL, timeout=120)
    assert j["state"] == "failed", j
    assert "writing the final model" in j["error"] and "over the job disk quota of 20480 bytes" in j["error"], j
    folder = srv.jobs_dir / str(jid)
    assert not list(folder.glob("*.safetensors*")), sorted(os.listdir(folder))


def test_a_rank_that_logs_without_end_is_stopped_at_the_quota(make_server, work):
    if bin_dir() is None:
        pytest.skip("ddpd is not built (set DDPD_BIN to the build folder)")
    real = bin_dir() / "ddpd-worker"
    chatty = work / "chatty-worker"
    chatty.write_text(f'''#!/usr/bin/python3
# Poses as ddpd-worker: a rank that starts, then logs to stderr without end.
import os, sys, time
if len(sys.argv) > 1:
    os.execv({str(real)!r}, [{str(real)!r}] + sys.argv[1:])
sys.stdin.buffer.read()
sys.stdout.write('{{"event":"start","rank":0,"world_size":1,"device":"cpu","params":3,"batches":1,"ts":%f}}\\n' % time.time())
sys.stdout.flush()
line = b"[rank 0] " + b"x" * 1014 + b"\\n"
while True:
    os.write(2, line * 64)
    time.sleep(0.002)
''')
    chatty.chmod(0o755)
    quota = 2 << 20
    srv = make_server(cpu_slots=1, extra=["--job-disk-quota", "2M"], env={"DDPD_WORKER": str(chatty)})
    jid = srv.submit(tiny_spec(name="chatty", max_restarts=2))["id"]
    t0 = time.monotonic()
    j = srv.wait_state(jid, FINAL, timeout=120)
    took = time.monotonic() - t0
    folder = srv.jobs_dir / str(jid)
    assert j["state"] == "failed", j
    assert j["restarts"] == 0, j  # over the quota is not a reason to try again
    assert f"the job folder jobs/{jid} holds" in j["error"], j
    assert f"over the job disk quota of {quota} bytes (ddpd serve --job-disk-quota); its ranks were stopped" \
        in j["error"], j
    size = (folder / "rank-0.log").stat().st_size
    assert size > quota
    srv.assert_no_workers()
    # Nothing writes there any more.
    assert (folder / "rank-0.log").stat().st_size == size
    print(f"rank log stopped at {size} bytes ({size / quota:.2f} x the quota) {took:.1f}s after submission")


def test_job_disk_quota_option_is_checked(make_server):
    srv = make_server(start=False, extra=["--job-disk-quota", "10X"])
    with pytest.raises(AssertionError, match=r"--job-disk-quota: expected a size such as 10G"):
        srv.start()
    for ok in ("none", "0", "1048576", "512MiB", "3g"):
        s = make_server(extra=["--job-disk-quota", ok])
        assert s.get("/healthz").status_code == 200
        s.stop()


def test_ranks_cannot_write_a_file_past_the_quota(make_server):
    """Each rank runs with RLIMIT_FSIZE at the quota (its log is its stderr): between two of
    the supervisor's measurements no file of it grows past the quota. A 2-rank job under a
    quota smaller than the CPU backend's 2 MiB shared-memory FIFO still runs (over TCP)."""
    quota = 1 << 20
    srv = make_server(cpu_slots=2, extra=["--job-disk-quota", "1M"])
    # Runs until both ranks have trained (over TCP) and the test has read their limits.
    jid = srv.submit(heavy_spec(2, steps=FOREVER_STEPS, name="limits", log_every=100))["id"]
    srv.wait_running(jid)
    j = wait_until(lambda: (lambda j: j if all(rk["step"] for rk in j["ranks"]) else None)(srv.job(jid)), 60,
                   "both ranks to report a step")
    for rk in j["ranks"]:
        with open(f"/proc/{rk['pid']}/limits") as f:
            line = next(l for l in f if l.startswith("Max file size"))
        assert line.split()[3] == str(quota), line
    assert srv.post(f"/v1/jobs/{jid}/cancel").status_code == 202
    j = srv.wait_state(jid, FINAL, timeout=120)
    assert j["state"] == "cancelled", j
