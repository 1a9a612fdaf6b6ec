"""Queueing through the real server: jobs competing for CPU slots run in FIFO order with
gang allocation (a job starts only when all its slots are free, and a younger job never
overtakes the head of the queue even when it would fit), and say why they wait."""
import time

from pylib.server import FOREVER_STEPS, heavy_spec, wait_until

FINAL = ("succeeded", "failed", "cancelled")


def holders(server):
    return [s["job"] for s in server.devices()["cpu_slots"]]


def test_fifo_gang_allocation_with_pending_reason(server):
    assert server.cpu_slots == 2
    # A holds one slot; B needs both; C needs one and would fit beside A, but must not
    # overtake B. A and B run until the test cancels them, so what the test observes
    # while they hold their slots does not depend on how fast the machine is.
    a = server.submit(heavy_spec(1, steps=FOREVER_STEPS, name="A"))["id"]
    server.wait_running(a)
    b = server.submit(heavy_spec(2, steps=FOREVER_STEPS, name="B"))["id"]
    c = server.submit(heavy_spec(1, steps=100, name="C"))["id"]

    def both_pending():
        jb, jc = server.job(b), server.job(c)
        return (jb, jc) if jb["pending_reason"] and jc["pending_reason"] else None

    jb, jc = wait_until(both_pending, 10, "pending reasons of B and C")
    assert server.job(a)["state"] == "running"
    assert jb["state"] == "queued" and jc["state"] == "queued", (jb["state"], jc["state"])
    rb, rc = jb["pending_reason"], jc["pending_reason"]
    assert rb == f"waiting for 1 CPU slot: held by job {a}", f"B lacks the slot A holds: {rb!r}"
    assert str(b) in rc, f"C should say it is queued behind job {b}: {rc!r}"
    assert jb["started_at"] is None and jb["ranks"] == [] and jc["ranks"] == []
    # One slot held by A, one free: yet C stays queued behind B (no overtaking), however
    # many times the supervisor schedules meanwhile.
    assert sorted(holders(server), key=str) == sorted([a, None], key=str), server.devices()
    time.sleep(0.5)
    assert server.job(c)["state"] == "queued" and server.job(a)["state"] == "running"

    # A ends: B (gang: both slots) starts, and C still waits for a free slot.
    assert server.post(f"/v1/jobs/{a}/cancel").status_code == 202
    jb = server.wait_running(b, timeout=60)
    assert holders(server) == [b, b], server.devices()
    jc = server.job(c)
    assert jc["state"] == "queued" and jc["pending_reason"], jc

    # B ends: C runs to the end.
    assert server.post(f"/v1/jobs/{b}/cancel").status_code == 202
    jobs = {x: server.wait_state(x, FINAL, timeout=90) for x in (a, b, c)}
    want = {a: "cancelled", b: "cancelled", c: "succeeded"}
    for x, j in jobs.items():
        assert j["state"] == want[x], f"job {x}: {j['state']} {j['error']}"
        assert j["pending_reason"] is None, j["pending_reason"]
    ja, jb, jc = jobs[a], jobs[b], jobs[c]
    assert jb["started_at"] >= ja["finished_at"], "B started before A freed its slot"
    assert jc["started_at"] >= jb["finished_at"], "C overtook B (or ran beside it)"
    for x in (a, b, c):
        states = [e["state"] for e in server.events(x) if e["event"] == "state"]
        assert states == ["queued", "starting", "running", want[x]], (x, states)
    assert holders(server) == [None, None]


def test_never_fits_is_rejected_and_queued_job_can_be_cancelled(server):
    r = server.post("/v1/jobs", json=heavy_spec(3, steps=10))
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["path"] == "world_size" and "2" in err["message"], err

    a = server.submit(heavy_spec(2, steps=FOREVER_STEPS, name="hog"))["id"]
    server.wait_running(a)
    q = server.submit(heavy_spec(1, steps=10, name="waiter"))["id"]
    wait_until(lambda: server.job(q)["pending_reason"], 10, "a pending reason")
    r = server.post(f"/v1/jobs/{q}/cancel")
    assert r.status_code == 202, r.text
    jq = server.wait_state(q, FINAL, timeout=10)
    assert jq["state"] == "cancelled" and jq["started_at"] is None and jq["ranks"] == [], jq
    assert server.job(a)["state"] == "running"
    states = [e["state"] for e in server.events(q) if e["event"] == "state"]
    assert states == ["queued", "cancelled"], states
    r = server.post(f"/v1/jobs/{a}/cancel")
    assert r.status_code == 202
    assert server.wait_state(a, FINAL, timeout=20)["state"] == "cancelled"
    assert holders(server) == [None, None]
