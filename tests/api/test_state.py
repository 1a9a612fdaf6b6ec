"""What the server says about a job must be true (issue 15, items 6, 14 and 15): a job
that succeeded after a restart has no error (the restart's reason is in restart_history);
a cancelled job's ranks read `cancelled`; a rank that joined reports the steps it took, as
its `done` event says; a damaged database is not served as healthy; the server's and the
ranks' files are the user's own (0600/0700); `ddpd run` keeps a spec's name inside
var/runs/."""
import json
import os
import sqlite3
import stat
import subprocess

from pylib.server import FOREVER_STEPS, bin_dir, heavy_spec, seed_spec

FINAL = ("succeeded", "failed", "cancelled")


def tiny(name, **over):
    s = seed_spec(name=name, epochs=None, steps=4, model=[{"type": "linear", "in": 2, "out": 1}],
                  data={"type": "synthetic", "samples": 8, "seed": 1}, batch_size=2, log_every=1)
    s.update(over)
    return s


def failing_worker(work, fail_first):
    """A DDPD_WORKER stand-in: the first `fail_first` starts of a rank read their document
    and exit 1; later ones are the real worker."""
    runs = work / "runs"
    runs.mkdir()
    w = work / "worker-wrapper"
    w.write_text(f'''#!/usr/bin/python3
import os, sys
REAL, RUNS, FAIL = {str(bin_dir() / "ddpd-worker")!r}, {str(runs)!r}, {fail_first}
if sys.argv[1:]:
    os.execv(REAL, [REAL] + sys.argv[1:])
n = 1 + sum(1 for f in os.listdir(RUNS))
open(os.path.join(RUNS, f"run-{{n}}"), "w").close()
if n <= FAIL:
    sys.stdin.buffer.read()
    sys.stderr.write("stand-in: attempt %d fails\\n" % n)
    sys.exit(1)
os.execv(REAL, [REAL])
''')
    w.chmod(0o755)
    return w


def test_a_job_that_succeeds_after_a_restart_has_no_error(make_server, work):
    srv = make_server(cpu_slots=1, env={"DDPD_WORKER": str(failing_worker(work, 1))})
    jid = srv.submit(tiny("restarted-once", max_restarts=2))["id"]
    j = srv.wait_state(jid, FINAL, timeout=60)
    assert j["state"] == "succeeded" and j["attempt"] == 2 and j["restarts"] == 1, j
    assert j["error"] is None, f"a succeeded job shows an error: {j['error']!r}"
    h = j["restart_history"]
    assert len(h) == 1 and h[0]["attempt"] == 1, h
    assert h[0]["reason"].startswith("restart 1 of 2 after rank 0 failed (exit code 1)"), h
    assert h[0]["rank"] == 0 and h[0]["exit_code"] == 1, h
    assert isinstance(h[0]["ts"], float) and j["created_at"] <= h[0]["ts"] <= j["finished_at"], (h, j)
    # The history is history: the state events still carry the reasons as they happened.
    evs = srv.events(jid)
    states = [e for e in evs if e["event"] == "state"]
    assert [e["state"] for e in states] == ["queued", "starting", "starting", "running", "succeeded"], states
    assert states[2].get("message", states[2].get("error", "")) == h[0]["reason"], states[2]
    # A job that fails after its restarts: the error is the last failure, the history the earlier ones.
    (work / "second").mkdir()
    srv2 = make_server(cpu_slots=1, env={"DDPD_WORKER": str(failing_worker(work / "second", 9))})
    k = srv2.submit(tiny("fails-thrice", max_restarts=2))["id"]
    j = srv2.wait_state(k, FINAL, timeout=60)
    assert j["state"] == "failed" and j["attempt"] == 3, j
    assert j["error"].startswith("rank 0 failed (exit code 1)"), j["error"]
    assert [e["attempt"] for e in j["restart_history"]] == [1, 2], j["restart_history"]
    assert [e["reason"][:12] for e in j["restart_history"]] == ["restart 1 of", "restart 2 of"], j
    # Listed jobs carry it too.
    listed = {x["id"]: x for x in srv2.get("/v1/jobs").json()["jobs"]}
    assert listed[k]["restart_history"] == j["restart_history"]
    print(f"restart history of a job that succeeded at attempt 2: {h}")


def test_a_cancelled_jobs_ranks_read_cancelled(make_server):
    srv = make_server(cpu_slots=3)
    one = srv.submit(heavy_spec(1, steps=FOREVER_STEPS, name="cancel-1"))["id"]
    two = srv.submit(heavy_spec(2, steps=FOREVER_STEPS, name="cancel-2"))["id"]
    srv.wait_running(one)
    srv.wait_running(two)
    for jid in (one, two):
        assert srv.post(f"/v1/jobs/{jid}/cancel").status_code == 202
    seen = {}
    for jid in (one, two):
        j = srv.wait_state(jid, FINAL, timeout=60)
        assert j["state"] == "cancelled", j
        seen[jid] = [(r["rank"], r["state"], r["exit_code"]) for r in j["ranks"]]
    # Rank 0 of the 1-rank job is ended by the cancel and nothing else.
    assert seen[one] == [(0, "cancelled", 5)], seen[one]
    # Every rank of the 2-rank job too: a rank whose peer was cancelled first learns it
    # from the peer's cancel notice and exits 5, never 3 (a comm error).
    assert seen[two] == [(0, "cancelled", 5), (1, "cancelled", 5)], seen[two]
    # The variant the report does not name: a server shutdown cancels its running jobs,
    # and their ranks read cancelled too.
    three = srv.submit(heavy_spec(1, steps=FOREVER_STEPS, name="shutdown"))["id"]
    srv.wait_running(three)
    assert srv.stop() == 0
    with sqlite3.connect(f"file:{srv.db}?mode=ro", uri=True) as c:
        rows = c.execute("SELECT state, exit_code FROM ranks WHERE job = ?", (three,)).fetchall()
    assert rows == [("cancelled", 5)], rows
    print(f"cancelled ranks: 1-rank job {seen[one]}, 2-rank job {seen[two]}, at shutdown {rows}")


def test_a_joined_ranks_step_is_the_steps_it_took(server):
    # 9 samples on 2 ranks, batch 2: rank 0 has 3 batches, rank 1 has 2 and joins after
    # step 2, then shadows step 3 (its done event says steps 3).
    spec = seed_spec(name="joined", world_size=2, data={"type": "synthetic", "samples": 9, "seed": 1},
                     batch_size=2, epochs=1, log_every=1)
    jid = server.submit(spec)["id"]
    j = server.wait_state(jid, FINAL, timeout=60)
    assert j["state"] == "succeeded", j
    evs = server.events(jid)
    done = {e["rank"]: e["steps"] for e in evs if e["event"] == "done"}
    last_loss = {}
    for e in evs:
        if e["event"] == "loss":
            last_loss[e["rank"]] = max(last_loss.get(e["rank"], 0), e["step"])
    assert done == {0: 3, 1: 3} and last_loss == {0: 3, 1: 2}, (done, last_loss)
    steps = {r["rank"]: r["step"] for r in j["ranks"]}
    assert steps == done, f"the ranks' step {steps} vs their done events {done}"
    # Its loss stays its latest reported one (step 2's).
    loss1 = [e["loss"] for e in evs if e["event"] == "loss" and e["rank"] == 1][-1]
    assert abs(j["ranks"][1]["loss"] - loss1) < 1e-6, (j["ranks"][1], loss1)
    assert j["step"] == 3 and j["loss"] is not None, j


def corrupt_interior_page(db):
    """Overwrites the cell area of the first interior b-tree page of the file (after the
    schema page): its children are unreachable, most queries still work."""
    raw = bytearray(db.read_bytes())
    psize = int.from_bytes(raw[16:18], "big")
    psize = 65536 if psize == 1 else psize
    for pg in range(2, len(raw) // psize + 1):
        off = (pg - 1) * psize
        if raw[off] in (0x02, 0x05):  # interior index / table b-tree page
            ncells = int.from_bytes(raw[off + 3:off + 5], "big")
            start = int.from_bytes(raw[off + 5:off + 7], "big") or 65536
            raw[off + start:off + psize] = bytes([0xA5]) * (psize - start)
            db.write_bytes(bytes(raw))
            return pg, ncells
    raise AssertionError("no interior page in the database")


def test_a_damaged_database_is_not_served_as_healthy(make_server):
    srv = make_server(cpu_slots=2)
    ids = [srv.submit(seed_spec(name=f"fill-{i}", log_every=1, epochs=None, steps=200))["id"] for i in range(4)]
    for jid in ids:
        assert srv.wait_state(jid, FINAL, timeout=120)["state"] == "succeeded"
    assert srv.get("/healthz").status_code == 200
    assert srv.stop() == 0
    with sqlite3.connect(str(srv.db)) as c:  # everything in the main file
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    # A healthy database passes the check at start: /healthz says 200.
    srv.start()
    assert srv.get("/healthz").status_code == 200
    assert srv.stop() == 0
    with sqlite3.connect(str(srv.db)) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    pg, cells = corrupt_interior_page(srv.db)
    srv.start()
    r = srv.get("/healthz")
    assert r.status_code >= 500, f"/healthz on a database with a damaged interior page {pg}: {r.status_code} {r.text}"
    msg = r.json()["error"]["message"]
    assert "quick check" in msg and str(srv.db) in msg, msg
    assert "failed its quick check at start" in srv.stderr()
    print(f"interior page {pg} ({cells} cells) damaged: /healthz {r.status_code}: {msg}")


def mode(p):
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_the_servers_and_ranks_files_are_private(make_server):
    srv = make_server(cpu_slots=2)
    jid = srv.submit(heavy_spec(2, steps=60, name="private", checkpoint={"every_steps": 20}))["id"]
    assert srv.wait_state(jid, FINAL, timeout=120)["state"] == "succeeded"
    db = srv.db
    files = [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm"), db.with_name(db.name + ".lock")]
    folders = [db.parent, srv.jobs_dir, srv.jobs_dir / str(jid)]
    for p in (srv.jobs_dir / str(jid)).rglob("*"):
        (folders if p.is_dir() else files).append(p)
    assert any(p.name == "model.safetensors" for p in files) and any(p.name.startswith("ckpt-") for p in folders)
    assert any(p.name == "rank-1.log" for p in files)
    loose = [f"{p} {oct(mode(p))}" for p in files if mode(p) & 0o077]
    loose += [f"{p} {oct(mode(p))}" for p in folders if mode(p) & 0o077]
    assert not loose, "readable by others: " + ", ".join(loose)
    print(f"{len(files)} files 0600, {len(folders)} folders 0700")


def test_ddpd_run_keeps_the_name_inside_var_runs(work):
    b = bin_dir()
    names = ["../../escaped", "/tmp/abs", "..", "a/../../b", ".hidden", "sp ace", ""]
    cwd = work / "deep" / "cwd"
    cwd.mkdir(parents=True)
    for name in names:
        spec = cwd / "spec.json"
        spec.write_text(json.dumps(tiny(name, steps=1)))
        r = subprocess.run([str(b / "ddpd"), "run", str(spec)], cwd=str(cwd), capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert r.returncode == 0, f"name {name!r}: {r.stderr}"
        out = r.stderr.split("output in ")[1].split("\n")[0]
        assert out.startswith("var/runs/") and "/" not in out[len("var/runs/"):], f"name {name!r}: {out}"
        assert not out[len("var/runs/"):].startswith("."), out
        assert (cwd / out / "model.safetensors").is_file(), out
        assert mode(cwd / out) == 0o700 and mode(cwd / out / "model.safetensors") == 0o600
    # Nothing was written beside or above the working folder.
    assert sorted(p.name for p in (work / "deep").iterdir()) == ["cwd"]
    assert sorted(p.name for p in work.iterdir()) == ["deep"]
    assert len(list((cwd / "var" / "runs").iterdir())) == len(names)
    # A control character never gets that far (issue 28): the spec is refused, naming it.
    spec.write_text(json.dumps(tiny("sp ace\nnl", steps=1)))
    r = subprocess.run([str(b / "ddpd"), "run", str(spec)], cwd=str(cwd), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "control character U+000A at byte 7 is not allowed" in r.stderr, r.stderr
    assert len(list((cwd / "var" / "runs").iterdir())) == len(names)
