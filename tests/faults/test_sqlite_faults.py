"""SQLite faults under the real server: the write lock held by another process beyond
busy_timeout (SQLITE_BUSY, for real), and a disk that reports SQLITE_FULL or SQLITE_IOERR
(tests/faults/faultvfs.c, linked into ddpd by -DDDPD_FAULT_INJECTION=ON; those tests skip
without it). Each time: the API answers 503 with a message that says what happened and
that a retry may succeed, the server keeps serving, nothing committed earlier is lost,
and a running job is not harmed by the events it cannot store (they are dropped and
counted in /metrics: ddpd_events_dropped_total)."""
import os
import re
import sqlite3
import time

import pytest

from pylib.server import FOREVER_STEPS, HeldWorker, alive, bin_dir, binary_has_faultvfs, heavy_spec, seed_spec, wait_until

FINAL = ("succeeded", "failed", "cancelled")

needs_faultvfs = pytest.mark.skipif(not binary_has_faultvfs(),
                                    reason="ddpd built without -DDDPD_FAULT_INJECTION=ON")


def tiny(name):
    return seed_spec(name=name, epochs=None, steps=1, model=[{"type": "linear", "in": 2, "out": 1}],
                     data={"type": "synthetic", "samples": 8, "seed": 1}, batch_size=2)


def metric(srv, name):
    r = srv.get("/metrics")
    assert r.status_code == 200, r.text
    m = re.search(rf"^{name} (\d+)", r.text, re.M)
    assert m, f"{name} not in /metrics"
    return int(m.group(1))


def integrity(db):
    with sqlite3.connect(str(db)) as c:
        return c.execute("PRAGMA integrity_check").fetchone()[0]


def assert_503(r, code, *words):
    assert r.status_code == 503, f"expected 503, got {r.status_code}: {r.text}"
    err = r.json()["error"]
    assert err["code"] == code, err
    for w in words:
        assert w in err["message"], f"{w!r} not in the message {err['message']!r}"


def test_write_lock_held_beyond_busy_timeout_answers_503(make_server):
    srv = make_server(cpu_slots=1)
    a = srv.submit(tiny("before-lock"))["id"]
    assert srv.wait_state(a, FINAL, timeout=30)["state"] == "succeeded"
    evs_a = srv.events(a)
    # Another process takes SQLite's write lock and keeps it past busy_timeout (5 s).
    holder = sqlite3.connect(str(srv.db), timeout=1, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        t0 = time.monotonic()
        r = srv.post("/v1/jobs", json=tiny("while-locked"), timeout=30)
        took = time.monotonic() - t0
        assert_503(r, "busy", "locked", "retry later")
        # Reads do not wait for the writer: the server answers the rest as usual.
        assert srv.get("/healthz").status_code == 200
        assert srv.job(a)["state"] == "succeeded"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    print(f"POST with the write lock held elsewhere: 503 after {took:.1f}s: {r.json()['error']['message']}")
    b = srv.submit(tiny("after-lock"))["id"]
    assert srv.wait_state(b, FINAL, timeout=30)["state"] == "succeeded"
    names = [j["name"] for j in srv.get("/v1/jobs").json()["jobs"]]
    assert names == ["after-lock", "before-lock"], names
    assert srv.events(a) == evs_a
    assert srv.stop() == 0
    assert integrity(srv.db) == "ok"


@needs_faultvfs
def test_disk_full_and_io_errors_answer_503_and_lose_nothing(make_server, work):
    control = work / "sqlite-fault"
    srv = make_server(cpu_slots=1, env={"DDPD_FAULT_SQLITE": str(control)})
    a = srv.submit(tiny("before-faults"))["id"]
    assert srv.wait_state(a, FINAL, timeout=30)["state"] == "succeeded"
    evs_a = srv.events(a)
    msgs = {}
    for mode, words in (("full", ("full", "retry later")), ("ioerr", ("I/O error", "retry later"))):
        control.write_text(mode)
        for i in range(3):  # and again: the store must not be stuck in the error
            r = srv.post("/v1/jobs", json=tiny(f"during-{mode}-{i}"))
            assert_503(r, "unavailable", *words)
        msgs[mode] = r.json()["error"]["message"]
        assert srv.get("/healthz").status_code == 200
        assert srv.job(a)["state"] == "succeeded"
        assert srv.events(a) == evs_a
    control.write_text("")
    b = srv.submit(tiny("after-faults"))["id"]
    assert srv.wait_state(b, FINAL, timeout=30)["state"] == "succeeded"
    jobs = srv.get("/v1/jobs").json()["jobs"]
    assert [j["name"] for j in jobs] == ["after-faults", "before-faults"], jobs
    assert srv.stop() == 0
    assert "SQLite I/O faults injected" in srv.stderr()
    assert integrity(srv.db) == "ok"
    with sqlite3.connect(str(srv.db)) as c:
        assert c.execute("SELECT count(*) FROM jobs WHERE name LIKE 'during-%'").fetchone()[0] == 0
    # The server starts again on the same database and has everything.
    srv.start()
    assert srv.job(a)["state"] == "succeeded" and srv.events(a) == evs_a
    for mode, m in msgs.items():
        print(f"POST while the disk reports {mode}: 503 {m}")


@needs_faultvfs
def test_disk_full_during_ingestion_does_not_harm_a_running_job(make_server, work):
    control = work / "sqlite-fault"
    srv = make_server(cpu_slots=1, env={"DDPD_FAULT_SQLITE": str(control)})
    # Runs until the test cancels it, a loss event every 100 steps (hundreds a second here,
    # tens under the sanitizers), so it reports while the disk is full.
    spec = heavy_spec(1, steps=FOREVER_STEPS, name="ingesting", log_every=100)
    jid = srv.submit(spec)["id"]
    j = srv.wait_running(jid)
    pid = j["ranks"][0]["pid"]
    wait_until(lambda: metric(srv, "ddpd_events_committed_total") >= 20, 30, "some events committed")
    with sqlite3.connect(f"file:{srv.db}?mode=ro", uri=True) as c:
        before = {r[0]: r[1] for r in c.execute("SELECT seq, body FROM events WHERE job = ?", (jid,))}
    assert before, "no event committed before the fault"
    dropped0 = metric(srv, "ddpd_events_dropped_total")
    control.write_text("full")
    time.sleep(1.5)
    alive_during = os.path.exists(f"/proc/{pid}")
    code_during = srv.get("/healthz").status_code
    control.write_text("")
    # The job goes on reporting once the disk has room again; then the test ends it.
    step_after = srv.job(jid)["step"] or 0
    wait_until(lambda: (srv.job(jid)["step"] or 0) > step_after, 60, "a loss stored after the fault")
    assert srv.job(jid)["state"] == "running"
    assert srv.post(f"/v1/jobs/{jid}/cancel").status_code == 202
    j = srv.wait_state(jid, FINAL, timeout=60)
    dropped = metric(srv, "ddpd_events_dropped_total") - dropped0
    assert alive_during, "the worker died while the disk was full"
    assert code_during == 200
    assert j["state"] == "cancelled", f"{j['state']}: {j['error']}"
    assert dropped > 0, "no event was dropped: the fault did not reach the event writer"
    evs = srv.events(jid)
    seqs = [e["seq"] for e in evs]
    assert seqs == sorted(set(seqs)), "events out of order or repeated"
    assert evs[-1]["event"] == "state" and evs[-1]["state"] == "cancelled", evs[-1]
    assert "dropped" in srv.stderr(), "the server did not warn about the dropped events"
    got = {e["seq"] for e in evs}
    lost = [s for s in before if s not in got]
    assert not lost, f"events committed before the fault are gone: {lost[:10]}"
    assert srv.stop() == 0
    assert integrity(srv.db) == "ok"
    print(f"disk full for 1.5 s during ingestion: {dropped} events dropped (counted), the job ran on; "
          f"{len(evs)} events stored")


@needs_faultvfs
def test_a_job_that_ends_on_a_full_disk_is_stored_once_there_is_room(make_server, work):
    """The disk is full when a job ends: its final state event, its attempt's end, its
    ranks' exit codes and its row cannot be stored. Its streams still end (the event is
    published all the same), and once the disk has room again the supervisor stores the
    end within seconds, without a restart: the row says succeeded, the ranks their exit
    codes, and the final state event is the store's last event of the job."""
    control = work / "sqlite-fault"
    held = HeldWorker(work)  # the rank ends only when the disk is full
    srv = make_server(cpu_slots=1, env={"DDPD_FAULT_SQLITE": str(control), **held.env})
    jid = srv.submit(heavy_spec(1, steps=2000, name="ends-on-a-full-disk"))["id"]
    j = srv.wait_running(jid)
    pid = j["ranks"][0]["pid"]
    control.write_text("full")
    held.release()
    wait_until(lambda: not alive(pid), 60, "the worker to end")
    wait_until(lambda: "is not stored; trying again" in srv.stderr(), 10, "the server to say the end is not stored")
    during = srv.job(jid)
    evs = srv.events(jid, timeout=30)  # ends: the final event was published
    assert evs[-1]["event"] == "state" and evs[-1]["state"] == "succeeded", evs[-1]
    control.write_text("")
    t0 = time.monotonic()
    j = srv.wait_state(jid, FINAL, timeout=10)
    took = time.monotonic() - t0
    assert during["state"] == "running", f"the row changed on a full disk: {during['state']}"
    assert j["state"] == "succeeded", f"{j['state']}: {j['error']}"
    assert [r["exit_code"] for r in j["ranks"]] == [0], j["ranks"]
    wait_until(lambda: "is stored now" in srv.stderr(), 10, "the server to say the end is stored")
    with sqlite3.connect(f"file:{srv.db}?mode=ro", uri=True) as c:
        kind, body = c.execute("SELECT kind, body FROM events WHERE job = ? ORDER BY seq DESC LIMIT 1",
                               (jid,)).fetchone()
    assert kind == "state" and '"succeeded"' in body, body
    assert srv.stop() == 0
    assert integrity(srv.db) == "ok"
    print(f"a job ended on a full disk: its end stored {took:.2f} s after the disk had room again")


@needs_faultvfs
def test_ends_of_two_attempts_on_a_full_disk_are_all_stored_once_there_is_room(make_server, work):
    """A job with a restart: its first attempt fails (exit 1) and its second succeeds, both
    while the disk is full. Once the disk has room, every end is stored: the row says
    succeeded at attempt 2, and each attempt's rank row has its own exit code (the first
    attempt's row is not lost because the second also ended on the full disk)."""
    control = work / "sqlite-fault"
    runs = work / "runs"
    runs.mkdir()
    wrapper = work / "worker-wrapper"
    wrapper.write_text(f'''#!/usr/bin/python3
# Poses as ddpd-worker: each start is a file in RUNS; run N ends when RUNS/go-N exists,
# the first with exit code 1, the second with 0.
import os, sys, time
REAL, RUNS = {str(bin_dir() / "ddpd-worker")!r}, {str(runs)!r}
if sys.argv[1:]:
    os.execv(REAL, [REAL] + sys.argv[1:])
sys.stdin.buffer.read()
n = 1 + sum(1 for f in os.listdir(RUNS) if f.startswith("run-"))
open(os.path.join(RUNS, f"run-{{n}}"), "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(RUNS, f"go-{{n}}")) and time.monotonic() < deadline:
    time.sleep(0.01)
sys.exit(1 if n == 1 else 0)
''')
    wrapper.chmod(0o755)
    srv = make_server(cpu_slots=1, env={"DDPD_FAULT_SQLITE": str(control), "DDPD_WORKER": str(wrapper)})
    jid = srv.submit(dict(tiny("two-ends-on-a-full-disk"), max_restarts=1))["id"]
    wait_until(lambda: (runs / "run-1").exists(), 30, "the first attempt to start")
    control.write_text("full")
    (runs / "go-1").touch()
    wait_until(lambda: (runs / "run-2").exists(), 30, "the restart")
    (runs / "go-2").touch()
    wait_until(lambda: "is not stored; trying again" in srv.stderr(), 30, "the server to say the end is not stored")
    control.write_text("")
    wait_until(lambda: "is stored now" in srv.stderr(), 10, "the server to say the end is stored")
    j = srv.job(jid)
    assert j["state"] == "succeeded" and j["attempt"] == 2, f"{j['state']} at attempt {j['attempt']}: {j['error']}"
    with sqlite3.connect(f"file:{srv.db}?mode=ro", uri=True) as c:
        rows = c.execute("SELECT attempt, rank, exit_code FROM ranks WHERE job = ? ORDER BY attempt, rank",
                         (jid,)).fetchall()
    assert rows == [(1, 0, 1), (2, 0, 0)], f"the ranks' end rows (attempt, rank, exit code): {rows}"
    assert srv.stop() == 0
    assert integrity(srv.db) == "ok"
