"""Nothing that can block runs on an HTTP thread (issue 15, item 8): the data check of
`POST /v1/jobs` runs on the planner's threads and processes, the request waits without a
thread, and a check stuck on its data (a FIFO, a hung mount; here also a planner that
never answers) costs a planner process until its deadline, never `/healthz` or a GET.
The deadline is DDPD_PLAN_TIMEOUT_S (30 s by default; a few seconds here)."""
import os
import stat
import threading
import time

import requests

from pylib.server import seed_spec

TIMEOUT_S = 6


def npy_spec(name):
    return seed_spec(name=name, data={"type": "npy", "x": "x.npy", "y": "y.npy"})


def post_many(server, n, spec_fn):
    """n concurrent POSTs; returns (threads, results) with results[i] = (status, json, seconds)."""
    results = [None] * n

    def one(i):
        t0 = time.monotonic()
        try:
            r = requests.post(f"{server.url}/v1/jobs", json=spec_fn(i), timeout=TIMEOUT_S * 10 + 60)
            body = r.json() if r.content else None
            results[i] = (r.status_code, body, time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 - reported by the assertions
            results[i] = (None, repr(e), time.monotonic() - t0)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads, results


def answered_promptly(server, jid, stuck, results=None):
    """While the stuck POSTs are in flight: /healthz, GET of a job and a synthetic POST
    are answered (bound 2 s: the machine is shared). Returns the worst /healthz time.
    With `results`, checks after the first /healthz that no POST was answered yet."""
    worst = 0.0
    for i in range(10):
        t0 = time.monotonic()
        r = requests.get(f"{server.url}/healthz", timeout=10)
        dt = time.monotonic() - t0
        assert r.status_code == 200
        assert dt < 2.0, f"/healthz took {dt:.2f} s while {stuck} data checks were stuck"
        worst = max(worst, dt)
        if i == 0 and results is not None:
            assert all(r is None for r in results), f"a stuck check was answered early: {results}"
        t0 = time.monotonic()
        r = requests.get(f"{server.url}/v1/jobs/{jid}", timeout=10)
        assert r.status_code == 200 and time.monotonic() - t0 < 2.0
        time.sleep(0.05)
    t0 = time.monotonic()
    r = requests.post(f"{server.url}/v1/jobs", json=seed_spec(name="synthetic"), timeout=10)
    assert r.status_code == 201 and time.monotonic() - t0 < 2.0, r.text
    return worst


def check_ends(results, threads):
    for t in threads:
        t.join(timeout=TIMEOUT_S * 10 + 90)
    for status, body, secs in results:
        assert status in (422, 503), (status, body)
        err = body["error"]
        assert err["message"], body
        if status == 422:
            assert err["path"].startswith("data"), body
        else:
            assert "busy" in err["message"] or "try again" in err["message"], body


def test_fifo_data_file_does_not_hold_http_threads(make_server):
    server = make_server(env={"DDPD_PLAN_TIMEOUT_S": str(TIMEOUT_S)})
    jid = server.submit(seed_spec(name="first"))["id"]
    for name in ("x.npy", "y.npy"):
        os.mkfifo(server.data_dir / name)
    n = 8  # more than the server's 4 HTTP threads
    threads, results = post_many(server, n, lambda i: npy_spec(f"fifo{i}"))
    time.sleep(0.3)  # let them reach the server (not a bound: the checks below are)
    stuck = sum(r is None for r in results)
    worst = answered_promptly(server, jid, stuck)
    print(f"/healthz worst {worst * 1000:.1f} ms with {stuck} of {n} POSTs on a FIFO in flight")
    check_ends(results, threads)
    # A check refused at open (a FIFO is not a regular file) or given up at the deadline.
    msgs = [b["error"]["message"] for s, b, _ in results if s == 422]
    assert msgs, results
    assert all("FIFO" in m or "regular file" in m or "within" in m for m in msgs), msgs


def test_hung_planner_does_not_hold_http_threads(make_server, work):
    """A planner stand-in (DDPD_WORKER) that never answers `--plan`: every check is stuck
    until its deadline, whatever the data; everything else is served meanwhile."""
    real = os.path.join(os.environ.get("DDPD_BIN", "build"), "ddpd-worker")
    wrapper = work / "hung-planner.sh"
    wrapper.write_text(f'#!/bin/sh\nif [ "$1" = "--plan" ]; then exec sleep 3600; fi\nexec "{real}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    server = make_server(env={"DDPD_PLAN_TIMEOUT_S": str(TIMEOUT_S), "DDPD_WORKER": str(wrapper)})
    (server.data_dir / "x.npy").write_bytes(b"")
    (server.data_dir / "y.npy").write_bytes(b"")
    jid = server.submit(seed_spec(name="first"))["id"]
    n = 12
    threads, results = post_many(server, n, lambda i: npy_spec(f"hung{i}"))
    time.sleep(0.3)
    # No POST can be answered before its deadline: they are stuck while /healthz is not.
    worst = answered_promptly(server, jid, n, results)
    print(f"/healthz worst {worst * 1000:.1f} ms with {n} stuck data checks")
    check_ends(results, threads)
    statuses = sorted(s for s, _, _ in results)
    # The two planner processes each gave up one check (422); the rest found none free.
    assert statuses.count(422) >= 1, results
    for s, b, secs in results:
        assert secs >= TIMEOUT_S * 0.9, (s, b, secs)
        if s == 422:
            assert f"within {TIMEOUT_S} s" in b["error"]["message"], b
    # The planner recovers: with the stand-in's processes killed, a synthetic job still runs.
    assert server.wait_state(jid, ("succeeded",), timeout=120)


def test_fifo_in_a_job_folder_does_not_hold_http_threads(make_server):
    """The variant on the read side: a rank log and the final model replaced by FIFOs
    (opened without O_NONBLOCK, each GET held its HTTP thread until a writer came)."""
    server = make_server()
    jid = server.submit(seed_spec(name="done"))["id"]
    server.wait_state(jid, ("succeeded",), timeout=120)
    folder = server.jobs_dir / str(jid)
    for name in ("rank-0.log", "model.safetensors"):
        p = folder / name
        if p.exists():
            p.unlink()
        os.mkfifo(p)
    for _ in range(6):  # more than the 4 HTTP threads
        t0 = time.monotonic()
        r = requests.get(f"{server.url}/v1/jobs/{jid}/logs?rank=0", timeout=10)
        assert time.monotonic() - t0 < 2.0
        assert r.status_code == 500 and "not a regular file" in r.json()["error"]["message"], r.text
        t0 = time.monotonic()
        r = requests.get(f"{server.url}/v1/jobs/{jid}/checkpoint", timeout=10)
        assert time.monotonic() - t0 < 2.0
        assert r.status_code == 404, r.text
    assert requests.get(f"{server.url}/healthz", timeout=10).status_code == 200
