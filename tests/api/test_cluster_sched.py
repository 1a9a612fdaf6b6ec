"""The scheduler through a real server with users (issue 32): a user's running limit passes
their next job over without blocking another user's; the highest priority starts first,
FIFO within a priority; a non-preemptible job is never preempted; a user may preempt
their own job with `ddpd preempt` (and not another's). The policy itself is
unit.test_server_sched_policy; preemption's exactness is faults.test_preemption."""
import subprocess

from pylib.server import FOREVER_STEPS, heavy_spec, wait_until
from test_permissions import ROOT_TOKEN, add_user, call

FINAL = ("succeeded", "failed", "cancelled")


def forever(name, **over):
    # A loss event every 10 steps: the job's `step` shows its progress (heavy_spec's own
    # log_every is steps // 50, far too rare for a job of FOREVER_STEPS).
    return heavy_spec(steps=FOREVER_STEPS, name=name, checkpoint={"every_steps": 50}, log_every=10, **over)


def submit(srv, token, spec):
    r = call(srv, token, "POST", "/v1/jobs", spec)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def job(srv, jid):
    return call(srv, ROOT_TOKEN, "GET", f"/v1/jobs/{jid}").json()


def queue(srv):
    return call(srv, ROOT_TOKEN, "GET", "/v1/queue").json()


def cancel_all(srv, ids):
    for j in ids:
        call(srv, ROOT_TOKEN, "POST", f"/v1/jobs/{j}/cancel")
    for j in ids:
        wait_until(lambda: job(srv, j)["state"] in FINAL, 120, f"job {j} ended")


def test_a_users_running_limit_passes_their_job_over(make_server):
    srv = make_server(cpu_slots=2, token=ROOT_TOKEN)
    alice = add_user(srv, "alice", "user", "--max-cpu-ranks", "1")
    carol = add_user(srv, "carol", "user")
    a1 = submit(srv, alice, forever("a1"))
    wait_until(lambda: job(srv, a1)["state"] == "running", 60, "alice's first job running")
    a2 = submit(srv, alice, forever("a2"))
    wait_until(lambda: (job(srv, a2).get("pending_reason") or "").startswith("quota"), 60, "a quota reason")
    assert job(srv, a2)["pending_reason"] == "quota: alice runs 1 of 1 CPU rank", job(srv, a2)
    # carol's job, submitted after, takes the free slot: the passed-over job blocks nobody.
    c1 = submit(srv, carol, forever("c1"))
    wait_until(lambda: job(srv, c1)["state"] == "running", 60, "carol's job running")
    q = queue(srv)
    assert [p["id"] for p in q["pending"]] == [a2] and q["pending"][0]["owner"] == "alice", q
    assert {r["id"]: r["owner"] for r in q["running"]} == {a1: "alice", c1: "carol"}, q
    # The CLI shows the same.
    out = subprocess.run([str(srv.bin / "ddpd"), "queue", "--server", srv.url], capture_output=True, text=True,
                         timeout=60, env={"DDPD_TOKEN": ROOT_TOKEN, "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and "quota: alice runs 1 of 1 CPU rank" in out.stdout, out
    cancel_all(srv, [a1, a2, c1])


def test_priority_order_and_non_preemptible_jobs(make_server):
    srv = make_server(cpu_slots=2, token=ROOT_TOKEN, extra=["--priority-age-s", "0"])
    ada = add_user(srv, "ada", "admin")
    alice = add_user(srv, "alice", "user", "--max-priority", "90")
    # Two non-preemptible jobs (an admin's) hold both slots.
    keep = [submit(srv, ada, forever(f"keep{i}", priority=10, preemptible=False)) for i in range(2)]
    for k in keep:
        wait_until(lambda: job(srv, k)["state"] == "running", 60, "the kept jobs running")
    low = submit(srv, alice, forever("low", priority=20))
    first = submit(srv, alice, forever("first", priority=80))
    second = submit(srv, alice, forever("second", priority=80))
    wait_until(lambda: len(queue(srv)["pending"]) == 3, 60, "three pending jobs")
    q = queue(srv)
    assert [p["id"] for p in q["pending"]] == [first, second, low], q
    head = q["pending"][0]["reason"]
    assert "held by jobs" in head and "not preemptible" in head, head
    assert not any(r["preempting"] for r in q["running"]), q
    # A user may not preempt an admin's job; the admin may.
    r = call(srv, alice, "POST", f"/v1/jobs/{keep[0]}/preempt")
    assert r.status_code == 403 and "ada" in r.json()["error"]["message"], r.text
    cancel_all(srv, keep + [low, first, second])


def test_a_user_preempts_their_own_job(make_server):
    srv = make_server(cpu_slots=2, token=ROOT_TOKEN)
    alice = add_user(srv, "alice", "user")
    jid = submit(srv, alice, forever("mine", world_size=2))
    wait_until(lambda: (job(srv, jid).get("step") or 0) >= 60, 120, "a checkpoint behind it")
    out = subprocess.run([str(srv.bin / "ddpd"), "preempt", str(jid), "--server", srv.url], capture_output=True,
                         text=True, timeout=60, env={"DDPD_TOKEN": alice, "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and "preempted" in out.stdout, out
    # Nothing else waits, so it goes back to the queue and starts again from its checkpoint.
    wait_until(lambda: job(srv, jid)["attempt"] == 2 and job(srv, jid)["state"] == "running", 120,
               "the job running again")
    j = job(srv, jid)
    assert j["preemptions"] == 1 and j["restarts"] == 0, j
    pre = [h for h in j["restart_history"] if h["reason"] == "preempted"]
    assert len(pre) == 1 and "by" not in pre[0] and pre[0]["step"] >= 50 and "alice" in pre[0]["message"], pre
    cancel_all(srv, [jid])
