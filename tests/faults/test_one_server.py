"""One server per database (issue 15, item 2). A second `ddpd serve` on a live database
used to recover it: it SIGKILLed the first server's ranks and requeued its jobs, even when
it then failed to bind its port, and with both running a queued job ran twice. Now the
database's lock file (DB.lock, flock) refuses the second server, naming the holder's pid,
before it touches anything; the lock goes with the process however it ends; and the port
is bound before recovery, so a server that cannot listen leaves the database as it was.
Also here: a restarted server leaves no rank reading `running` (item 15), a job's end
stored late (after a full disk) keeps its progress (item 15), and a deleted job's end is
not retried forever (item 10)."""
import os
import re
import socket
import sqlite3
import subprocess
import time

import pytest

from pylib.server import (FOREVER_STEPS, HeldWorker, alive, binary_has_faultvfs, heavy_spec, proc_stat, seed_spec,
                          wait_until)

FINAL = ("succeeded", "failed", "cancelled")


def second_server(first, listen="127.0.0.1:0", timeout=60):
    """Runs another `ddpd serve` on `first`'s database until it exits (or `timeout`):
    (exit code, stderr). A server that starts listening is stopped and reported as -1."""
    errp = first.root / f"second-{time.monotonic_ns()}.err"
    cmd = [str(first.bin / "ddpd"), "serve", "--listen", listen, "--db", str(first.db), "--data-dir",
           str(first.data_dir), "--cpu-slots", "2", "--gpus", "none"]
    with open(errp, "wb") as f:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=f,
                             cwd=str(first.root), env=dict(os.environ, OMP_NUM_THREADS="1"),
                             start_new_session=True)
    deadline = time.monotonic() + timeout
    while p.poll() is None and time.monotonic() < deadline:
        if "listening on" in errp.read_text(errors="replace"):
            break
        time.sleep(0.05)
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
        return -1, errp.read_text(errors="replace")
    return p.returncode, errp.read_text(errors="replace")


def rank_procs(j):
    """{pid: start time} of a job's ranks as the API shows them."""
    out = {}
    for r in j["ranks"]:
        st = proc_stat(r["pid"])
        assert st, f"rank {r['rank']} (pid {r['pid']}) is not running"
        out[r["pid"]] = st[2]
    return out


def db_rows(db, sql, args=()):
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        return c.execute(sql, args).fetchall()


def test_second_server_on_a_live_database_is_refused_and_touches_nothing(make_server):
    a = make_server(cpu_slots=2)
    jid = a.submit(heavy_spec(2, steps=FOREVER_STEPS, name="live"))["id"]
    ranks = rank_procs(a.wait_running(jid))
    queued = a.submit(heavy_spec(1, steps=5, name="waits"))["id"]  # no slot left: stays queued
    assert a.job(queued)["state"] == "queued"
    events_before = db_rows(a.db, "SELECT job, seq, body FROM events ORDER BY job, seq")
    tries = [("another port", "127.0.0.1:0"), ("the same port", f"127.0.0.1:{a.port}")]
    for what, listen in tries:
        rc, err = second_server(a, listen)
        assert rc == 1, f"a second server on {what} was not refused (exit {rc}):\n{err[-2000:]}"
        assert f"in use by another ddpd server (pid {a.pid()} " in err, err[-2000:]
        assert "killed rank" not in err and "listening" not in err, err[-2000:]
        # The first server's ranks still run (same processes), its jobs are as they were.
        assert all(alive(p, t) for p, t in ranks.items()), f"{what}: the first server's ranks were killed"
        j = a.job(jid)
        assert j["state"] == "running" and j["attempt"] == 1 and j["restarts"] == 0, j
        assert a.job(queued)["state"] == "queued"
    # Not one event was added (recovery adds `queued`/`failed` state events).
    assert db_rows(a.db, "SELECT seq, body FROM events WHERE job = ? ORDER BY seq", (queued,)) == [
        r[1:] for r in events_before if r[0] == queued]
    assert (a.db.parent / "ddpd.db.lock").read_text().strip() == str(a.pid())
    # The first server goes on as if nothing happened: the queued job runs after a cancel.
    assert a.post(f"/v1/jobs/{jid}/cancel").status_code == 202
    assert a.wait_state(jid, FINAL, timeout=60)["state"] == "cancelled"
    assert a.wait_state(queued, FINAL, timeout=120)["state"] == "succeeded"
    print(f"second server refused twice: {err.strip().splitlines()[-1]}")


def test_the_lock_goes_with_the_server_however_it_ends(make_server):
    """The variant the report does not name: the lock must not outlive its server. After a
    SIGTERM and after a SIGKILL the next server starts on the same database (the lock file
    stays, its old pid is only a hint), and after the SIGKILL it recovers the dead server's
    job."""
    a = make_server(cpu_slots=1)
    done = a.submit(seed_spec(name="before"))["id"]
    assert a.wait_state(done, FINAL, timeout=60)["state"] == "succeeded"
    first_pid = a.pid()
    assert a.stop() == 0
    assert (a.db.parent / "ddpd.db.lock").exists()
    a.start()
    assert (a.db.parent / "ddpd.db.lock").read_text().strip() == str(a.pid()) != str(first_pid)
    jid = a.submit(heavy_spec(1, steps=FOREVER_STEPS, name="orphan"))["id"]
    a.wait_running(jid)
    a.kill9()
    a.start()
    j = a.wait_state(jid, FINAL, timeout=30)
    assert j["state"] == "failed" and j["error"] == "server restarted", j
    assert a.job(done)["state"] == "succeeded"


def test_a_server_that_cannot_listen_leaves_the_database_alone(make_server):
    """A server killed with a job running leaves that job `running` in the database. The
    next server's recovery would fail it: but when its port is taken, it must exit before
    recovery touches anything. Then, on a free port, recovery fails the job and none of its
    ranks still reads `running` or `starting` with a dead pid (item 15)."""
    a = make_server(cpu_slots=2)
    jid = a.submit(heavy_spec(2, steps=FOREVER_STEPS, name="left-running"))["id"]
    a.wait_running(jid)
    a.kill9()
    a.assert_no_workers()
    before = (db_rows(a.db, "SELECT state, attempt, error FROM jobs WHERE id = ?", (jid,)),
              db_rows(a.db, "SELECT max(seq) FROM events WHERE job = ?", (jid,)),
              db_rows(a.db, "SELECT rank, state, pid FROM ranks WHERE job = ? ORDER BY rank", (jid,)))
    assert before[0][0][0] == "running" and {r[1] for r in before[2]} == {"running"}, before
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        rc, err = second_server(a, f"127.0.0.1:{taken.getsockname()[1]}")
    finally:
        taken.close()
    assert rc == 1 and "cannot listen on" in err, f"exit {rc}:\n{err[-2000:]}"
    after = (db_rows(a.db, "SELECT state, attempt, error FROM jobs WHERE id = ?", (jid,)),
             db_rows(a.db, "SELECT max(seq) FROM events WHERE job = ?", (jid,)),
             db_rows(a.db, "SELECT rank, state, pid FROM ranks WHERE job = ? ORDER BY rank", (jid,)))
    assert after == before, f"the database changed although the server could not listen: {before} -> {after}"
    a.start()
    j = a.wait_state(jid, FINAL, timeout=30)
    assert j["state"] == "failed" and j["error"] == "server restarted", j
    states = [(r["rank"], r["state"], r["exit_code"]) for r in j["ranks"]]
    assert len(states) == 2 and all(s == "failed" for _, s, _ in states), f"ranks after the restart: {states}"
    print(f"port taken: '{err.strip().splitlines()[-1]}'; after recovery the ranks read {states}")


def commits_while_idle(db, seconds):
    """Whether anything committed to `db` during `seconds` (PRAGMA data_version of a
    connection of our own changes when another connection commits)."""
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        v0 = c.execute("PRAGMA data_version").fetchone()[0]
        time.sleep(seconds)
        return c.execute("PRAGMA data_version").fetchone()[0] != v0
    finally:
        c.close()


def cancel_and_delete(srv, jid):
    assert srv.post(f"/v1/jobs/{jid}/cancel").status_code in (202, 409)
    deadline = time.monotonic() + 60
    while True:  # delete as soon as the row is final, as a script does
        r = srv.delete(f"/v1/jobs/{jid}")
        if r.status_code == 204:
            return
        assert r.status_code == 409 and time.monotonic() < deadline, r.text
        time.sleep(0.002)


def test_deleted_jobs_ends_are_not_retried(make_server):
    """Cancel and delete, over and over, queued, starting and running jobs: afterwards the
    idle server commits nothing. Before: a job deleted while its end was being stored stayed
    in the retry list for ever (two write transactions, or a refused event, every second),
    and each refused retry made the next job's end look unsaved too, so the retries grew
    with the cycles (2,250 write transactions/s after 1,500 cycles)."""
    srv = make_server(cpu_slots=1)
    blocker = srv.submit(heavy_spec(1, steps=FOREVER_STEPS, name="blocker"))["id"]
    srv.wait_running(blocker)
    cycles = 0
    for i in range(40):  # queued behind the blocker
        cancel_and_delete(srv, srv.submit(heavy_spec(1, steps=FOREVER_STEPS, name=f"q{i}"))["id"])
        cycles += 1
    cancel_and_delete(srv, blocker)
    for i in range(30):  # each starts at once: cancelled starting, or (every sixth) running
        jid = srv.submit(heavy_spec(1, steps=FOREVER_STEPS, name=f"r{i}"))["id"]
        if i % 6 == 0:
            srv.wait_running(jid)
        cancel_and_delete(srv, jid)
        cycles += 1
    wait_until(lambda: srv.free_cpu_slots() == 1, 30, "the slot to be free")
    time.sleep(2)  # any end still being stored has had its first retry (1 s)
    committed = commits_while_idle(srv.db, 4)
    err = srv.stderr()
    assert not committed, f"the idle server kept committing after {cycles} cancel+delete cycles:\n{err[-2000:]}"
    retried = err.count("is not stored; trying again")
    dropped = err.count("no longer retried")
    assert retried == dropped, f"{retried} ends not stored, {dropped} of them dropped as deleted:\n{err[-2000:]}"
    assert srv.get("/v1/jobs").json()["jobs"] == []
    print(f"{cycles} cancel+delete cycles: no commit in 4 s afterwards; "
          f"{retried} ends of deleted jobs found unsaved and dropped")


@pytest.mark.skipif(not binary_has_faultvfs(), reason="ddpd built without -DDDPD_FAULT_INJECTION=ON")
def test_an_end_stored_after_a_full_disk_keeps_the_jobs_progress(make_server, work):
    """The disk is full when a job ends; once it has room the supervisor stores the end.
    Before: that retried update set the attempt again, which cleared the job's step and
    loss (null after the recovery although the job had reported them)."""
    control = work / "sqlite-fault"
    held = HeldWorker(work)  # the rank ends only when the disk is full
    srv = make_server(cpu_slots=1, env={"DDPD_FAULT_SQLITE": str(control), **held.env})
    spec = heavy_spec(1, steps=2000, name="progress-kept")
    jid = srv.submit(spec)["id"]
    srv.wait_running(jid)
    wait_until(lambda: srv.job(jid)["step"], 30, "a loss to be stored")
    control.write_text("full")
    held.release()
    wait_until(lambda: "is not stored; trying again" in srv.stderr(), 60, "the end, refused")
    during = srv.job(jid)
    assert during["state"] == "running" and during["step"] and during["loss"] is not None, during
    control.write_text("")
    wait_until(lambda: "is stored now" in srv.stderr(), 30, "the end to be stored")
    j = srv.job(jid)
    assert j["state"] == "succeeded", j
    assert (j["step"], j["loss"]) == (during["step"], during["loss"]), (
        f"progress before the end ({during['step']}, {during['loss']}) vs after it was stored "
        f"({j['step']}, {j['loss']})")
    assert [r["exit_code"] for r in j["ranks"]] == [0] and j["ranks"][0]["step"], j["ranks"]
    print(f"end stored after a full disk: step {j['step']}, loss {j['loss']:.4f} kept")
