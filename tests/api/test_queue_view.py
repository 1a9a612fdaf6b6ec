"""The queue as a view (issue 32): GET /v1/queue and `ddpd queue` on a 1-slot server with
one running job and two queued ones: the JSON's shape, the order, the reasons, times that
grow, ?limit with pending_total, 401 without the token; the command's two tables and its
--json. Every wait is bounded (wait_until)."""
import json

from pylib.server import FOREVER_STEPS, heavy_spec, wait_until
from test_cli import cli

FINAL = ("succeeded", "failed", "cancelled")
RUNNING_KEYS = {"id", "name", "owner", "priority", "preemptible", "device", "world_size", "slots", "state",
                "running_s", "time_limit", "preempting"}
PENDING_KEYS = {"id", "name", "owner", "priority", "preemptible", "effective_priority", "device", "world_size", "state",
                "waited_s", "position", "reason"}


def queue(srv, query=""):
    r = srv.get("/v1/queue" + query)
    assert r.status_code == 200, f"GET /v1/queue{query}: {r.status_code} {r.text}"
    return r.json()


def start_three(srv):
    """A runs (priority 80, a time limit of an hour); B (priority 70) and C (the default)
    wait behind it, in that order whether the scheduler orders by id or by priority."""
    a = srv.submit(heavy_spec(1, steps=FOREVER_STEPS, name="qa", priority=80, time_limit=3600))["id"]
    srv.wait_running(a)
    b = srv.submit(heavy_spec(1, steps=FOREVER_STEPS, name="qb", priority=70))["id"]
    c = srv.submit(heavy_spec(1, steps=FOREVER_STEPS, name="qc"))["id"]
    return a, b, c


def both_reasons(srv):
    def ok():
        q = queue(srv)
        return q if len(q["pending"]) == 2 and all(p["reason"] for p in q["pending"]) else None
    return wait_until(ok, 20, "two pending jobs with their reasons")


def cancel_all(srv, ids):
    for x in ids:
        assert srv.post(f"/v1/jobs/{x}/cancel").status_code == 202
    for x in ids:
        srv.wait_state(x, FINAL, timeout=60)


def test_queue_shape_order_reasons_and_limit(make_server):
    srv = make_server(cpu_slots=1)
    a, b, c = start_three(srv)
    q = both_reasons(srv)
    assert set(q) == {"running", "pending", "pending_total", "slots"}, q
    assert q["slots"] == {"gpus": 0, "cpu": 1}, q["slots"]
    assert q["pending_total"] == 2

    [r] = q["running"]
    assert set(r) == RUNNING_KEYS, r
    assert (r["id"], r["name"], r["state"], r["device"], r["world_size"]) == (a, "qa", "running", "cpu", 1), r
    assert r["slots"] == [0] and r["priority"] == 80 and r["time_limit"] == 3600, r
    assert r["owner"] == "local" and r["preemptible"] is True and r["preempting"] is False, r
    assert r["running_s"] >= 0

    pb, pc = q["pending"]
    for p in (pb, pc):
        assert set(p) == PENDING_KEYS, p
        assert p["state"] == "queued" and p["device"] == "cpu" and p["world_size"] == 1 and p["owner"] == "local", p
        assert p["effective_priority"] >= p["priority"] and p["waited_s"] >= 0, p
    assert [pb["id"], pc["id"]] == [b, c] and [pb["position"], pc["position"]] == [1, 2], q["pending"]
    assert (pb["name"], pb["priority"], pc["name"], pc["priority"]) == ("qb", 70, "qc", 50), q["pending"]
    # The reasons are the job's own (GET /v1/jobs/{id}'s pending_reason, the scheduler's).
    assert "slot" in pb["reason"], pb["reason"]
    assert str(b) in pc["reason"], pc["reason"]
    assert srv.job(c)["pending_reason"] == pc["reason"]

    # Times grow while the jobs wait and run.
    wait_until(lambda: (lambda q2: q2["pending"][0]["waited_s"] > pb["waited_s"]
                        and q2["running"][0]["running_s"] > r["running_s"])(queue(srv)),
               20, "waited_s and running_s to grow")

    # ?limit cuts the pending list, and pending_total still counts them all.
    q1 = queue(srv, "?limit=1")
    assert [p["id"] for p in q1["pending"]] == [b] and q1["pending_total"] == 2, q1
    assert len(q1["running"]) == 1
    for bad in ("0", "10001", "x", "-1"):
        r = srv.get("/v1/queue?limit=" + bad)
        assert r.status_code == 400, (bad, r.status_code, r.text)
        assert r.json()["error"]["path"] == "limit", r.text
    r = srv.get("/v1/queue?lmit=1")
    assert r.status_code == 400 and "lmit" in r.text, r.text

    # A's end: B runs, C waits for it; then nothing.
    assert srv.post(f"/v1/jobs/{a}/cancel").status_code == 202
    srv.wait_running(b)

    def b_runs():
        q2 = queue(srv)
        return q2 if [x["id"] for x in q2["running"]] == [b] and [x["id"] for x in q2["pending"]] == [c] else None
    q2 = wait_until(b_runs, 30, "B running and C pending")
    assert q2["pending"][0]["position"] == 1 and q2["running"][0]["slots"] == [0], q2
    cancel_all(srv, [b, c])
    q3 = queue(srv)
    assert q3["running"] == [] and q3["pending"] == [] and q3["pending_total"] == 0, q3


def test_queue_needs_the_token(make_server):
    srv = make_server(cpu_slots=1, token="s3cret-token-for-the-queue")
    r = srv.get("/v1/queue", auth=False)
    assert r.status_code == 401, r.text
    assert r.json()["error"]["code"] == "unauthorized"
    assert srv.get("/v1/queue").status_code == 200
    out = cli(srv, "queue", token=False)
    assert out.returncode == 1 and "401" in out.stderr, (out.returncode, out.stderr)
    out = cli(srv, "queue")
    assert out.returncode == 0, out.stderr


def test_ddpd_queue_prints_both_tables_and_json(make_server):
    srv = make_server(cpu_slots=1)
    a, b, c = start_three(srv)
    both_reasons(srv)
    out = cli(srv, "queue")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "RUNNING (1)", out.stdout
    assert lines[1].split()[:6] == ["ID", "NAME", "OWNER", "PRI", "DEVICES", "RUNNING"], out.stdout
    row = lines[2].split()
    assert row[:6] == [str(a), "qa", "local", "80", "cpu", "0"] and row[-1] == "1h00m", out.stdout
    i = lines.index("PENDING (2)")
    assert lines[i + 1].split() == ["#", "ID", "NAME", "OWNER", "PRI", "DEVICES", "WAITED", "REASON"], out.stdout
    rb, rc = lines[i + 2].split(), lines[i + 3].split()
    assert rb[:7] == ["1", str(b), "qb", "local", "70", "1", "cpu"], out.stdout
    assert rc[:7] == ["2", str(c), "qc", "local", "50", "1", "cpu"], out.stdout
    # The reason in full, as the server words it.
    q = queue(srv)
    assert lines[i + 2].endswith(q["pending"][0]["reason"]) and lines[i + 3].endswith(q["pending"][1]["reason"])
    assert len(lines) == i + 4, out.stdout

    out = cli(srv, "queue", "--limit", "1")
    assert out.returncode == 0, out.stderr
    assert "PENDING (1 of 2; --limit N shows more)" in out.stdout, out.stdout

    out = cli(srv, "queue", "--json")
    assert out.returncode == 0, out.stderr
    j = json.loads(out.stdout)
    assert [x["id"] for x in j["running"]] == [a] and [x["id"] for x in j["pending"]] == [b, c], j
    assert j["pending_total"] == 2 and j["slots"] == {"gpus": 0, "cpu": 1}, j

    for args in (["--limit", "0"], ["--limit", "x"], ["extra"], ["--nope"]):
        out = cli(srv, "queue", *args)
        assert out.returncode == 2 and out.stderr.startswith("ddpd queue:"), (args, out.returncode, out.stderr)
    cancel_all(srv, [a, b, c])
    out = cli(srv, "queue")
    assert out.returncode == 0 and out.stdout.splitlines() == ["RUNNING (0)", "  none", "", "PENDING (0)", "  none"], \
        out.stdout
