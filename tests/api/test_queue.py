"""Queueing through the real server: jobs competing for CPU slots run in FIFO order with
gang allocation (a job starts only when all its slots are free, and a younger job never
overtakes the head of the queue even when it would fit), and say why they wait."""
import time

from pylib.server import heavy_spec, wait_until

FINAL = ("succeeded", "failed", "cancelled")


def holders(server):
    return [s["job"] for s in server.devices()["cpu_slots"]]


def test_fifo_gang_allocation_with_pending_reason(server):
    assert server.cpu_slots == 2
    # A holds one slot for a while; B needs both; C needs one and would fit beside A,
    # but must not overtake B.
    a = server.submit(heavy_spec(1, seconds=4.0, name="A"))["id"]
    server.wait_running(a)
    b = server.submit(heavy_spec(2, seconds=1.5, name="B"))["id"]
    c = server.submit(heavy_spec(1, seconds=0.5, name="C"))["id"]

    def both_pending():
        jb, jc = server.job(b), server.job(c)
        return (jb, jc) if jb["pending_reason"] and jc["pending_reason"] else None

    jb, jc = wait_until(both_pending, 10, "pending reasons of B and C")
    ja = server.job(a)
    assert ja["state"] == "running", f"A finished too soon for this test to see the queue: {ja}"
    assert jb["state"] == "queued" and jc["state"] == "queued", (jb["state"], jc["state"])
    rb, rc = jb["pending_reason"], jc["pending_reason"]
    assert "2" in rb and "slot" in rb, f"B should wait for 2 free slots: {rb!r}"
    assert str(b) in rc, f"C should say it is queued behind job {b}: {rc!r}"
    assert jb["started_at"] is None and jb["ranks"] == [] and jc["ranks"] == []
    # One slot held by A, one free: yet C stays queued behind B (no overtaking).
    assert sorted(holders(server), key=str) == sorted([a, None], key=str), server.devices()
    time.sleep(0.5)
    assert server.job(c)["state"] == "queued" and server.job(a)["state"] == "running"

    # While B runs (gang: both slots), C waits for a free slot.
    jb = server.wait_running(b, timeout=60)
    assert holders(server) == [b, b], server.devices()
    jc = server.job(c)
    if jc["state"] == "queued":  # B may already be done on a fast machine
        assert jc["pending_reason"], jc

    jobs = {x: server.wait_state(x, FINAL, timeout=90) for x in (a, b, c)}
    for x, j in jobs.items():
        assert j["state"] == "succeeded", f"job {x}: {j['state']} {j['error']}"
        assert j["pending_reason"] is None, j["pending_reason"]
    ja, jb, jc = jobs[a], jobs[b], jobs[c]
    assert jb["started_at"] >= ja["finished_at"], "B started before A freed its slot"
    assert jc["started_at"] >= jb["finished_at"], "C overtook B (or ran beside it)"
    for x in (a, b, c):
        states = [e["state"] for e in server.events(x) if e["event"] == "state"]
        assert states == ["queued", "starting", "running", "succeeded"], (x, states)
    assert holders(server) == [None, None]


def test_never_fits_is_rejected_and_queued_job_can_be_cancelled(server):
    r = server.post("/v1/jobs", json=heavy_spec(3, steps=10))
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["path"] == "world_size" and "2" in err["message"], err

    a = server.submit(heavy_spec(2, seconds=3.0, name="hog"))["id"]
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
