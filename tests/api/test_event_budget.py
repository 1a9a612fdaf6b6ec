"""A job's stored events are bounded (issue 28, item 3): one 1-rank job with `log_every` 1
wrote about 12,000 events/s into the database, 33 MB in 12 s, without end. Now `ddpd
serve --job-events-max` bounds the loss events the database keeps of a job: past it the
store thins the older ones (the newest half whole; each stretch of steps keeps its first,
last, lowest and highest loss), and every other event stays. The bytes of a job's stored
events count against `--job-disk-quota`. What must not change: a live stream still gets
every event (the hub, not the database, feeds it), GET /v1/jobs/{id}, the metrics, and a
reader that attaches mid-job gets the thinned history and then every live event, with no
gap or duplicate where they meet."""
import json
import re

import pytest
import requests

from pylib.server import FOREVER_STEPS, bin_dir, seed_spec, wait_until

FINAL = ("succeeded", "failed", "cancelled")


def losses(evs):
    return [e for e in evs if e["event"] == "loss"]


def metric(server, name):
    m = re.search(rf"^{name} (\d+)", server.get("/metrics").text, re.M)
    assert m, name
    return int(m.group(1))


def check_stored(evs, budget, first, last):
    """What thinning keeps of a finished job's stored events `evs`."""
    seqs = [e["seq"] for e in evs]
    assert seqs == sorted(set(seqs)), "seqs not increasing"
    ls = losses(evs)
    assert len(ls) <= budget, f"{len(ls)} loss events stored, budget {budget}"
    steps = [e["step"] for e in ls]
    assert steps[0] == first and steps[-1] == last, (steps[:3], steps[-3:])
    # The newest half of the budget stays whole.
    assert steps[-budget // 2:] == list(range(last - budget // 2 + 1, last + 1))


def test_a_job_logging_every_step_keeps_a_bounded_history_and_streams_every_step(make_server, curl_streams):
    budget, steps = 200, 3000
    srv = make_server(cpu_slots=1, extra=["--job-events-max", str(budget)])
    spec = seed_spec(name="every-step", epochs=None, steps=steps, log_every=1,
                     eval={"every_steps": 500, "data": {"type": "synthetic", "samples": 30, "seed": 2}},
                     checkpoint={"every_steps": 1000, "keep_last": 5})
    jid = srv.submit(spec)["id"]
    live = curl_streams(f"{srv.url}/v1/jobs/{jid}/events?format=ndjson", fmt="ndjson", max_time=240)
    got = []
    while True:
        e = live.next(timeout=120)
        if e is None:
            break
        got.append(e)
    assert got and got[-1]["event"] == "state" and got[-1]["state"] == "succeeded", got[-3:]
    # The live stream: every event, every step.
    assert [e["seq"] for e in got] == list(range(1, len(got) + 1))
    assert [e["step"] for e in losses(got)] == list(range(1, steps + 1))
    # While the hub holds the job's newest events (up to 10,000 of them), a stream of it
    # is served from there, whole.
    assert srv.events(jid) == got
    assert metric(srv, "ddpd_events_thinned_total") >= steps - budget
    assert metric(srv, "ddpd_events_dropped_total") == 0
    # The database, as a restarted server reads it: within the budget, both ends, the
    # newest half of the budget whole, and every other event (evals, checkpoints, starts,
    # states, done) exactly as streamed.
    srv.stop()
    srv.start()
    stored = srv.events(jid)
    check_stored(stored, budget, 1, steps)
    assert [e for e in stored if e["event"] != "loss"] == [e for e in got if e["event"] != "loss"]
    assert len([e for e in stored if e["event"] == "eval"]) == steps // 500
    assert len([e for e in stored if e["event"] == "checkpoint"]) == steps // 1000
    # What the job's row, its curve and /metrics say is unchanged by thinning.
    j = srv.job(jid)
    last = losses(got)[-1]
    assert j["step"] == steps and j["loss"] == last["loss"], (j, last)
    m = srv.get(f"/v1/jobs/{jid}/metrics").json()
    assert m["first_step"] == 1 and m["last_step"] == steps and m["points"] <= budget, m
    assert m["mean"]["step"][0] == 1 and m["mean"]["step"][-1] == steps
    assert len(m["eval"]["step"]) == steps // 500


def test_a_reader_that_attaches_mid_job_gets_the_thinned_history_then_every_live_event(make_server, work):
    """A stand-in rank writes 20,000 loss steps (more than the hub's tail of 10,000, so a
    new reader's history comes from the database), waits for the test to attach, then
    writes 2,000 more: the reader gets the stored (thinned) history up to step 20,000 and
    then every step after it, each seq once, in order."""
    if bin_dir() is None:
        pytest.skip("ddpd is not built (set DDPD_BIN to the build folder)")
    budget, first, more = 1000, 20_000, 2_000
    real = bin_dir() / "ddpd-worker"
    gate, paused = work / "go-on", work / "paused"
    w = work / "pausing-worker"
    w.write_text(f'''#!/usr/bin/python3
# Poses as ddpd-worker: {first} loss steps at once, a pause until the test says, {more} more.
import os, sys, time
if len(sys.argv) > 1:
    os.execv({str(real)!r}, [{str(real)!r}] + sys.argv[1:])
sys.stdin.buffer.read()
out = sys.stdout.buffer
ts = time.time()
out.write(b'{{"event":"start","rank":0,"world_size":1,"device":"cpu","params":3,"batches":1,"ts":%f}}\\n' % ts)
def steps(a, b):
    for s in range(a, b + 1):
        out.write(b'{{"event":"loss","rank":0,"step":%d,"epoch":0,"loss":%r,"samples_per_s":1.0,"ts":%f}}\\n'
                  % (s, 1.0 / s + (9.0 if s == 777 else 0.0), time.time()))
        if s % 1000 == 0:
            out.write(b'{{"event":"eval","rank":0,"step":%d,"loss":0.5,"samples":8,"ts":%f}}\\n' % (s, time.time()))
            out.flush()
steps(1, {first})
out.flush()
open({str(paused)!r}, "w").close()
deadline = time.monotonic() + 120
while not os.path.exists({str(gate)!r}) and time.monotonic() < deadline:
    time.sleep(0.01)
for k in range({first} + 1, {first + more} + 1, 100):
    steps(k, k + 99)
    out.flush()
    time.sleep(0.005)
out.write(b'{{"event":"done","rank":0,"steps":{first + more},"loss":0.5,"seconds":1.0,"ts":%f}}\\n' % time.time())
out.flush()
''')
    w.chmod(0o755)
    srv = make_server(cpu_slots=1, env={"DDPD_WORKER": str(w)}, extra=["--job-events-max", str(budget)])
    spec = seed_spec(name="attach", epochs=None, steps=1, model=[{"type": "linear", "in": 2, "out": 1}],
                     data={"type": "synthetic", "samples": 8, "seed": 1}, batch_size=2)
    jid = srv.submit(spec)["id"]
    wait_until(lambda: paused.exists() and srv.job(jid).get("step") == first, 120,
               f"the job's first {first} steps stored")
    # Attach now: the hub holds the newest 10,000 events, the database the thinned rest.
    with requests.get(f"{srv.url}/v1/jobs/{jid}/events", params={"format": "ndjson"}, stream=True,
                      timeout=120) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = []
        for line in lines:
            if not line:
                continue
            e = json.loads(line)
            got.append(e)
            if e["event"] == "loss" and e["step"] == first:
                break  # the history up to the pause: let the rank go on, and follow it live
        gate.touch()
        for line in lines:
            if line:
                got.append(json.loads(line))
    assert got[-1]["event"] == "state" and got[-1]["state"] == "succeeded", got[-3:]
    seqs = [e["seq"] for e in got]
    assert seqs == sorted(set(seqs)), "a seq twice or out of order"
    steps = [e["step"] for e in losses(got)]
    assert steps == sorted(set(steps))
    history = [s for s in steps if s <= first]
    # The history came thinned from the database: its first step, the spike, its newest
    # half of the budget whole...
    assert len(history) <= budget and history[0] == 1 and 777 in history, (len(history), history[:5])
    assert history[-budget // 2:] == list(range(first - budget // 2 + 1, first + 1))
    # ... then every live step, none missing where the two meet.
    assert [s for s in steps if s > first] == list(range(first + 1, first + more + 1))
    # The seqs after the seam are consecutive: nothing published was skipped.
    seam = next(i for i, e in enumerate(got) if e["event"] == "loss" and e["step"] == first)
    assert seqs[seam:] == list(range(seqs[seam], seqs[-1] + 1))
    # Every eval, live or stored.
    assert [e["step"] for e in got if e["event"] == "eval"] == list(range(1000, first + more + 1, 1000))
    srv.stop()
    srv.start()
    check_stored(srv.events(jid), budget, 1, first + more)


def test_stored_events_count_against_the_job_disk_quota(make_server):
    """With no event budget, a job's stored events alone go over a 64 KiB quota: the job
    is stopped and fails naming its events and the quota (its folder holds a few KiB)."""
    quota = 64 * 1024
    srv = make_server(cpu_slots=1, extra=["--job-disk-quota", "64K", "--job-events-max", "none"])
    jid = srv.submit(seed_spec(name="chatty", epochs=None, steps=FOREVER_STEPS, log_every=1))["id"]
    j = srv.wait_state(jid, FINAL, timeout=120)
    assert j["state"] == "failed" and j["restarts"] == 0, j
    assert f"the job folder jobs/{jid} holds" in j["error"], j
    assert "stored events" in j["error"], j
    assert f"over the job disk quota of {quota} bytes (ddpd serve --job-disk-quota); its ranks were stopped" \
        in j["error"], j
    srv.assert_no_workers()


def test_job_events_max_option_is_checked(make_server):
    for bad in ("99", "-1", "20k", "lots"):
        srv = make_server(start=False, extra=["--job-events-max", bad])
        with pytest.raises(AssertionError, match=r"--job-events-max: expected a number of events from 100 "):
            srv.start()
    for ok in ("none", "100", "20000"):
        s = make_server(extra=["--job-events-max", ok])
        assert s.get("/healthz").status_code == 200
        s.stop()
