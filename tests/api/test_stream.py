"""Event streams of the real server: Server-Sent Events (`id:` = seq, `event:` = kind),
NDJSON by query or Accept header, history then live then the end, and resuming with
Last-Event-ID: exactly the missed events, no duplicates, on a finished job and while a
job runs (disconnecting and reconnecting several times). Many subscribers get the same."""
import threading
import time

import requests

from pylib.server import FOREVER_STEPS, heavy_spec, seed_spec, wait_until

FINAL = ("succeeded", "failed", "cancelled")


def strip(evs):
    return [{k: v for k, v in e.items() if not k.startswith("_")} for e in evs]


def sse_url(server, jid):
    return f"{server.url}/v1/jobs/{jid}/events"


def test_sse_frames_and_ndjson_agree(server, curl_streams):
    jid = server.submit(seed_spec(world_size=2, log_every=10))["id"]
    sse = curl_streams(sse_url(server, jid), fmt="sse").rest(timeout=60)
    for e in sse:
        assert e["_id"] == str(e["seq"]) and e["_event"] == e["event"], e
    seqs = [e["seq"] for e in sse]
    assert seqs == list(range(1, len(sse) + 1))
    assert sse[-1]["event"] == "state" and sse[-1]["state"] == "succeeded"
    nd_q = curl_streams(sse_url(server, jid) + "?format=ndjson", fmt="ndjson").rest(timeout=30)
    nd_h = curl_streams(sse_url(server, jid), fmt="ndjson", headers=["Accept: application/x-ndjson"]).rest(timeout=30)
    assert strip(sse) == nd_q == nd_h
    r = requests.get(sse_url(server, jid), timeout=10)
    assert r.headers["Content-Type"].startswith("text/event-stream"), r.headers
    assert r.headers.get("Cache-Control", "no-cache").startswith("no-cache"), r.headers
    r = requests.get(sse_url(server, jid), params={"format": "ndjson"}, timeout=10)
    assert r.headers["Content-Type"].startswith("application/x-ndjson"), r.headers
    r = requests.get(sse_url(server, jid), params={"format": "xml"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["path"] == "format", r.text


def test_sse_resume_on_finished_job(server, curl_streams):
    jid = server.submit(seed_spec(world_size=2, log_every=5))["id"]
    full = curl_streams(sse_url(server, jid)).rest(timeout=60)
    n = len(full)
    assert n > 100 and full[-1]["state"] == "succeeded"
    for k in [0, 1, 2, n // 3, n // 2, n - 2, n - 1]:
        got = curl_streams(sse_url(server, jid), headers=[f"Last-Event-ID: {k}"]).rest(timeout=30)
        assert [e["seq"] for e in got] == list(range(k + 1, n + 1)), f"Last-Event-ID {k}: got seqs {[e['seq'] for e in got][:5]}..."
        assert strip(got) == strip(full[k:])
    # At or past the end: nothing more, and the stream ends at once.
    for k in (n, n + 100):
        t0 = time.monotonic()
        got = curl_streams(sse_url(server, jid), headers=[f"Last-Event-ID: {k}"]).rest(timeout=10)
        assert got == [] and time.monotonic() - t0 < 5
    r = requests.get(sse_url(server, jid), headers={"Last-Event-ID": "abc"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["path"] == "Last-Event-ID", r.text


def test_sse_resume_while_running_gives_exactly_the_missed_events(server, curl_streams):
    # Runs until the test cancels it before the last connection.
    jid = server.submit(heavy_spec(2, steps=FOREVER_STEPS, name="live", log_every=100))["id"]
    got = []
    last = None
    pieces = 0
    live_resumes = 0
    # Read a bit, hang up, wait (events pile up meanwhile), resume from the last id seen.
    for i in range(4):
        hdr = [f"Last-Event-ID: {last}"] if last is not None else []
        if last is not None and server.job(jid)["state"] == "running":
            live_resumes += 1
        if i == 3:
            assert server.post(f"/v1/jobs/{jid}/cancel").status_code == 202
        st = curl_streams(sse_url(server, jid), headers=hdr)
        want = 40 if i < 3 else None
        if want is None:
            part = st.rest(timeout=120)
        else:
            part = []
            while len(part) < want:
                e = st.next(timeout=60)
                if e is None:
                    break
                part.append(e)
            st.close()
        if part:
            if last is not None:
                assert part[0]["seq"] == last + 1, f"resumed after {last} but got {part[0]['seq']} first"
            last = part[-1]["seq"]
        got += part
        pieces += 1
        if part and part[-1]["event"] == "state" and part[-1]["state"] in FINAL:
            break
        time.sleep(0.3)
    assert got and got[-1]["event"] == "state" and got[-1]["state"] == "cancelled", got[-3:]
    seqs = [e["seq"] for e in got]
    assert len(seqs) == len(set(seqs)), "duplicates after resuming"
    assert seqs == list(range(1, len(seqs) + 1)), "gaps after resuming"
    hist = server.events(jid)
    assert strip(got) == hist
    assert pieces == 4 and live_resumes == 3, (pieces, live_resumes)


def test_history_then_live_for_many_subscribers(server):
    # Runs until every subscriber is attached; then the test cancels it.
    jid = server.submit(heavy_spec(2, steps=FOREVER_STEPS, name="fanout", log_every=100))["id"]
    server.wait_running(jid)
    results = {}

    def follow(i):
        try:
            r = requests.get(sse_url(server, jid), params={"format": "ndjson"}, stream=True, timeout=120)
            evs = []
            import json
            for line in r.iter_lines():
                if line:
                    evs.append(json.loads(line))
            results[i] = evs
        except Exception as e:  # reported below
            results[i] = e

    threads = [threading.Thread(target=follow, args=(i,), daemon=True) for i in range(40)]
    for i, t in enumerate(threads):
        t.start()
        if i % 10 == 9:
            time.sleep(0.2)  # late joiners get history first, then live
    wait_until(lambda: "\nddpd_stream_subscribers 40\n" in server.get("/metrics").text, 60,
               "all 40 subscribers to be attached")
    assert server.job(jid)["state"] == "running"
    assert server.post(f"/v1/jobs/{jid}/cancel").status_code == 202
    for t in threads:
        t.join(timeout=150)
    assert not any(t.is_alive() for t in threads), "some streams did not end after the job finished"
    hist = server.events(jid)
    assert hist[-1]["state"] == "cancelled"
    for i, evs in results.items():
        assert not isinstance(evs, Exception), f"subscriber {i}: {evs!r}"
        assert evs == hist, f"subscriber {i}: {len(evs)} events vs {len(hist)} in the history"
    wait_until(lambda: "\nddpd_stream_subscribers 0\n" in server.get("/metrics").text, 5,
               "the subscriber gauge to drop back to 0")


def test_stream_of_cancelled_job_ends(server, curl_streams):
    jid = server.submit(heavy_spec(1, steps=10 ** 7, name="cancel-me", log_every=100))["id"]
    st = curl_streams(sse_url(server, jid) + "?format=ndjson", fmt="ndjson")
    st.until(lambda e: e["event"] == "loss", timeout=60)
    assert server.post(f"/v1/jobs/{jid}/cancel").status_code == 202
    rest = st.rest(timeout=30)
    assert rest[-1]["event"] == "state" and rest[-1]["state"] == "cancelled", rest[-3:]
