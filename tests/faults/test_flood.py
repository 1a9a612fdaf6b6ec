"""A worker that floods its stdout with events (a python rank behind DDPD_WORKER writes
200,000 loss events as fast as it can): the server reads a bounded amount per turn, so
the flood waits in the pipe (backpressure on the worker) instead of in the server's
memory; the server keeps answering, stores every event in order (the loss events thinned
to the default --job-events-max of 20,000 as they come: the newest half whole, the first
and last step kept), and the job succeeds.
(Before the bound the supervisor read until the pipe was empty, which a fast writer never
lets happen: it held every event of the flood in memory, ~1.6 KiB each, and served
nothing else meanwhile. bench/load-flood measures the rate and the /healthz latency.)"""
import re
import threading
import time

from pylib.server import bin_dir, seed_spec, wait_until

EVENTS = 200_000
RSS_LIMIT_MIB = 150  # the server holds a bounded tail (hub, store queue), not the flood


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1)) / 1024


def test_stdout_flood_is_backpressured(make_server, work):
    import pytest
    if bin_dir() is None:
        pytest.skip("ddpd is not built (set DDPD_BIN to the build folder)")
    real = bin_dir() / "ddpd-worker"
    flood = work / "flood-worker"
    flood.write_text(f'''#!/usr/bin/python3
# Poses as ddpd-worker: a rank that writes {EVENTS} loss events as fast as it can.
import os, sys, time
if len(sys.argv) > 1:
    os.execv({str(real)!r}, [{str(real)!r}] + sys.argv[1:])
sys.stdin.buffer.read()
out = sys.stdout.buffer
ts = time.time()
out.write(b'{{"event":"start","rank":0,"world_size":1,"device":"cpu","params":3,"batches":1,"ts":%f}}\\n' % ts)
line = b'{{"event":"loss","rank":0,"step":%d,"epoch":0,"loss":0.5,"samples_per_s":1.0,"ts":%f}}\\n'
for k in range(0, {EVENTS}, 1000):
    out.write(b"".join(line % (s, ts) for s in range(k + 1, k + 1001)))
out.write(b'{{"event":"done","rank":0,"steps":{EVENTS},"loss":0.5,"seconds":1.0,"ts":%f}}\\n' % time.time())
out.flush()
''')
    flood.chmod(0o755)
    srv = make_server(cpu_slots=1, env={"DDPD_WORKER": str(flood)})
    spec = seed_spec(name="flood", epochs=None, steps=1, model=[{"type": "linear", "in": 2, "out": 1}],
                     data={"type": "synthetic", "samples": 8, "seed": 1}, batch_size=2)
    rss0 = rss_mib(srv.pid())
    peak = [rss0]
    health = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mib(srv.pid()))
            health.append(srv.get("/healthz", timeout=10).status_code)
            time.sleep(0.02)

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    t0 = time.monotonic()
    jid = srv.submit(spec)["id"]
    try:
        j = srv.wait_state(jid, ("succeeded", "failed", "cancelled"), timeout=120)
    finally:
        stop.set()
        th.join(15)
    took = time.monotonic() - t0
    assert j["state"] == "succeeded", j
    assert health and set(health) == {200}, f"/healthz during the flood: {sorted(set(health))}"
    assert peak[0] - rss0 < RSS_LIMIT_MIB, (
        f"the server grew from {rss0:.0f} to {peak[0]:.0f} MiB during a flood of {EVENTS} events")
    r = srv.get("/metrics").text
    dropped = int(re.search(r"^ddpd_events_dropped_total (\d+)", r, re.M).group(1))
    assert dropped == 0, f"{dropped} events dropped: backpressure should have slowed the worker instead"
    thinned = int(re.search(r"^ddpd_events_thinned_total (\d+)", r, re.M).group(1))
    evs = srv.events(jid, timeout=60)
    losses = [e["step"] for e in evs if e["event"] == "loss"]
    budget = 20_000
    assert len(losses) <= budget and thinned >= EVENTS - budget, (len(losses), thinned)
    assert losses == sorted(set(losses)) and losses[0] == 1, losses[:5]
    assert losses[-budget // 2:] == list(range(EVENTS - budget // 2 + 1, EVENTS + 1)), losses[-5:]
    seqs = [e["seq"] for e in evs]
    others = [e["event"] for e in evs if e["event"] != "loss"]
    # Every seq went to one event, and every event that is not a loss is there.
    assert seqs == sorted(set(seqs)) and seqs[-1] == EVENTS + len(others), (seqs[-1], others)
    assert others[-2:] == ["done", "state"] and "start" in others, others
    print(f"flood of {EVENTS} events: job succeeded in {took:.1f}s ({EVENTS / took:.0f} events/s), server RSS "
          f"{rss0:.0f} -> peak {peak[0]:.0f} MiB, {len(health)} /healthz answered 200, none dropped, "
          f"{len(losses)} loss events stored ({thinned} thinned)")
