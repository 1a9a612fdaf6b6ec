"""test_infer_pool.py — the inference pool of `ddpd serve` under load and faults, over HTTP
(issue 29): a client that disconnects mid-generation stops it (the worker sees cancel; the
process is free again), streamed or not; 50 concurrent requests against a pool of 2 with a
small queue are each answered 200 or 503 with Retry-After and the server's memory stays
bounded; models evicted by the memory cap and by idle time; a job deleted while its model
is loaded; a worker that crashes or hangs mid-request (the request gets a clear error and
the pool recovers); a GPU request on the emulated GPU takes a scheduler slot and gives it
back.

The worker is tests/helpers/infer_worker.py (pylib/infer.py), fake or a proxy of the real
`ddpd-worker --infer`: its knobs (a delay per token, a crash, a hang, the resident bytes
a load reports) make each case happen on any machine; every wait is bounded and no test
relies on how long anything takes."""
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from pylib.common import bin_dir
from pylib.infer import gpt_spec, infer_server, stream_lines, train  # noqa: F401
from pylib.server import alive, seed_spec, wait_until


def idle(st):
    return all(p["state"] in ("idle", "stopped") for p in st["processes"]) and st["queue"]["waiting"] == 0


def test_a_client_that_disconnects_stops_its_generation(infer_server):
    inf = infer_server(procs=1)
    srv = inf.srv
    jid = train(srv, gpt_spec(steps=2, every=2), vocab=256)
    inf.ctl(delay_s=0.05)  # 4096 tokens would take minutes

    # A stream: read three tokens, then hang up.
    r = srv.post(f"/v1/jobs/{jid}/generate", json={"prompt": "a", "max_new_tokens": 4096, "stream": True},
                 stream=True, timeout=60)
    assert r.status_code == 200
    got = 0
    for ln in r.iter_lines():
        if ln.strip():
            got += 1
        if got == 3:
            break
    r.close()
    st = inf.wait_status(lambda s: idle(s) and s["counters"]["cancels"] >= 1, "the generation to stop")
    pid = st["processes"][0]["pid"]
    assert pid and alive(pid), st  # the process stays, free again
    finals = [e for e in inf.log() if e["event"] == "final" and e.get("op") == "generate"]
    cancels = [e for e in inf.log() if e["event"] == "cancel"]
    assert cancels and finals and finals[-1]["cancelled"] is True and finals[-1]["tokens"] < 4096, inf.log()

    # A plain (deferred) request whose client closes its socket.
    body = json.dumps({"prompt": "b", "max_new_tokens": 4096}).encode()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"POST /v1/jobs/%d/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % (jid, len(body)) + body)
        inf.wait_status(lambda s: s["processes"][0]["state"] == "busy", "the request to run")
    st = inf.wait_status(lambda s: idle(s) and s["counters"]["cancels"] >= 2, "the second generation to stop")
    assert st["processes"][0]["pid"] == pid, st
    # The process takes the next request.
    inf.ctl()
    r = inf.generate(jid, prompt="c", max_new_tokens=3)
    assert r.status_code == 200 and len(r.json()["ids"]) == 3, r.text
    assert inf.status()["processes"][0]["pid"] == pid


def rss_kib(pid):
    for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1])
    raise AssertionError("no VmRSS")


def test_fifty_concurrent_requests_against_a_pool_of_two(infer_server):
    inf = infer_server(procs=2, queue=2)
    srv = inf.srv
    jid = train(srv, gpt_spec(steps=2, every=2), vocab=256)
    inf.ctl(delay_s=0.02)
    assert inf.generate(jid, prompt="warm", max_new_tokens=2).status_code == 200
    before = rss_kib(srv.pid())
    results = [None] * 50

    def one(i):
        try:
            r = inf.generate(jid, prompt=f"request {i}", max_new_tokens=10, timeout=120)
            results[i] = (r.status_code, r.headers.get("Retry-After"), r.json())
        except Exception as e:  # noqa: BLE001 (reported below)
            results[i] = (None, None, repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads), "a request was not answered within 180 s"
    codes = [r[0] for r in results]
    assert set(codes) <= {200, 503}, results
    ok = [r for r in results if r[0] == 200]
    busy = [r for r in results if r[0] == 503]
    assert ok and busy, codes
    assert all(len(r[2]["ids"]) == 10 for r in ok), ok
    for _, retry, body in busy:
        assert retry is not None and int(retry) >= 1, busy
        assert body["error"]["code"] == "busy" and "--infer-queue" in body["error"]["message"], body
    st = inf.wait_status(idle, "the pool to be idle")
    assert st["counters"]["rejected"] == len(busy) and st["counters"]["requests"] == 1 + len(ok), (st, codes)
    assert st["alive"] <= 2, st
    # The server held at most 2 running and 2 waiting requests: its memory did not grow
    # with the 50 (each answer is a few hundred bytes; the bound is generous for malloc).
    assert rss_kib(srv.pid()) - before < 32 * 1024, (before, rss_kib(srv.pid()))


def test_models_are_evicted_by_the_memory_cap_and_by_idle_time(infer_server):
    inf = infer_server(procs=2, memory="10K", idle_s=1)
    srv = inf.srv
    jid = train(srv, gpt_spec(steps=4, every=2), vocab=256)
    inf.ctl(resident_bytes=6000)
    assert inf.generate(jid, prompt="a", max_new_tokens=2).status_code == 200
    assert inf.status()["memory"]["used"] == 6000
    # The checkpoint is another model: both would not fit, so the idle final one goes.
    r = inf.generate(jid, prompt="a", max_new_tokens=2, step=2)
    assert r.status_code == 200, r.text
    st = inf.status()
    loaded = [p["model"]["name"] for p in st["processes"] if p["model"]]
    assert loaded == ["ckpt-2"] and st["memory"]["used"] == 6000, st
    assert st["counters"]["evictions"] >= 1, st
    # A model larger than the cap alone is refused.
    inf.ctl(resident_bytes=20000)
    r = inf.generate(jid, prompt="a", max_new_tokens=2)
    assert r.status_code == 507 and r.json()["error"]["code"] == "model_too_large", r.text
    assert "--infer-memory" in r.json()["error"]["message"], r.text
    # Idle for --infer-idle-s: unloaded, the process ended.
    pids = [p["pid"] for p in inf.status()["processes"] if p["pid"]]
    st = inf.wait_status(lambda s: s["alive"] == 0 and s["memory"]["used"] == 0, "the idle models to go")
    assert st["counters"]["evictions"] >= 2, st
    wait_until(lambda: not any(alive(p) for p in pids), 20, f"processes {pids} to end")


def test_a_job_deleted_while_its_model_is_loaded(infer_server):
    inf = infer_server(procs=2)
    srv = inf.srv
    jid = train(srv, gpt_spec(steps=2, every=2), vocab=256)
    other = train(srv, gpt_spec(steps=2, every=2, name="other"), vocab=256)
    assert inf.generate(jid, prompt="a", max_new_tokens=2).status_code == 200
    assert inf.generate(other, prompt="a", max_new_tokens=2).status_code == 200
    st = inf.status()
    pid = next(p["pid"] for p in st["processes"] if p["model"] and p["model"]["job"] == jid)
    assert srv.delete(f"/v1/jobs/{jid}").status_code == 204
    st = inf.wait_status(lambda s: not any(p["model"] and p["model"]["job"] == jid for p in s["processes"]),
                         "the deleted job's model to be unloaded")
    wait_until(lambda: not alive(pid), 20, f"process {pid} to end")
    r = inf.generate(jid, prompt="a", max_new_tokens=2)
    assert r.status_code == 404, r.text
    # The other job's model stays.
    assert any(p["model"] and p["model"]["job"] == other for p in st["processes"]), st
    assert inf.generate(other, prompt="a", max_new_tokens=2).status_code == 200


def test_a_worker_that_crashes_or_hangs_mid_request(infer_server):
    inf = infer_server(procs=1, timeout_s=2)
    srv = inf.srv
    jid = train(srv, gpt_spec(steps=2, every=2), vocab=256)
    assert inf.generate(jid, prompt="a", max_new_tokens=2).status_code == 200
    first = inf.status()["processes"][0]["pid"]

    inf.ctl(crash_after=2, exit_code=3)
    r = inf.generate(jid, prompt="a", max_new_tokens=10)
    assert r.status_code == 500, r.text
    e = r.json()["error"]
    assert e["code"] == "inference_failed" and f"pid {first}" in e["message"], e
    assert "exited with status 3" in e["message"], e
    inf.ctl()
    r = inf.generate(jid, prompt="a", max_new_tokens=3)
    assert r.status_code == 200, r.text
    second = inf.status()["processes"][0]["pid"]
    assert second != first and alive(second)

    inf.ctl(hang_after=1)
    r = inf.generate(jid, prompt="a", max_new_tokens=10)
    assert r.status_code == 504, r.text
    e = r.json()["error"]
    assert e["code"] == "timeout" and f"pid {second}" in e["message"] and "--infer-timeout-s" in e["message"], e
    wait_until(lambda: not alive(second), 20, f"the hung process {second} to be killed")
    inf.ctl()
    r = inf.generate(jid, prompt="a", max_new_tokens=3)
    assert r.status_code == 200, r.text
    st = inf.status()
    assert st["counters"]["failures"] == 2 and st["processes"][0]["state"] == "idle", st
    assert "inference process 0" in srv.stderr(), srv.stderr()[-2000:]


def emu_env(n=2):
    b = bin_dir()
    m = b / "libddpd-cuda-emu.so" if b else None
    if m is None or not m.is_file():
        pytest.skip("no emulated CUDA module (libddpd-cuda-emu.so) in the build")
    return {"DDPD_CUDA_PLUGIN": str(m), "DDPD_CUDA_EMU": str(n),
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(n))}


def test_a_gpu_request_takes_a_scheduler_slot_and_gives_it_back(infer_server):
    inf = infer_server(procs=2, cpu_slots=1, extra=["--gpus", "auto"], env=emu_env(1))
    srv = inf.srv
    jid = train(srv, gpt_spec(steps=4, every=2), vocab=256)  # on the CPU (the spec says so)
    assert [(g["job"], g["inference"]) for g in srv.devices()["gpus"]] == [(None, None)]
    inf.ctl(delay_s=0.05)
    box = {}
    t = threading.Thread(target=lambda: box.update(r=inf.generate(jid, prompt="a", max_new_tokens=40,
                                                                   device="cuda", timeout=300)))
    t.start()
    wait_until(lambda: srv.devices()["gpus"][0]["inference"] == jid, 120, "the GPU slot held by inference")
    assert srv.devices()["gpus"][0]["job"] is None
    assert 'ddpd_slots_used{kind="cuda"} 1' in srv.get("/metrics").text
    t.join(300)
    assert box["r"].status_code == 200, box["r"].text
    model = next(p["model"] for p in inf.status()["processes"] if p["model"])
    assert model["device"] == "cuda" and model["gpu"] == 0, model
    load = [e for e in inf.log() if e["event"] == "load"][-1]
    assert load["device"] == "cuda" and load["gpu"] == 0 and load["cuda_visible"] == "0", load
    # Loaded and idle, it keeps the slot: another cuda model finds no GPU free.
    inf.ctl()
    r = inf.generate(jid, prompt="a", max_new_tokens=2, device="cuda", step=2)
    assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1, r.text
    assert r.json()["error"]["path"] == "device" and "no GPU is free" in r.json()["error"]["message"], r.text
    assert srv.devices()["gpus"][0]["inference"] == jid
    # A job that waits for the GPU gets it: the idle model gives it up.
    job = srv.submit(seed_spec(name="on-gpu", device="cuda", epochs=None, steps=3, batch_size=4, log_every=1,
                               data={"type": "synthetic", "samples": 16, "seed": 1}))["id"]
    j = srv.wait_state(job, ("succeeded", "failed", "cancelled"), timeout=300)
    assert j["state"] == "succeeded", j
    st = inf.wait_status(lambda s: s["alive"] == 0, "the GPU model to be unloaded")
    assert st["counters"]["evictions"] >= 1, st
    assert srv.devices()["gpus"][0]["inference"] is None
