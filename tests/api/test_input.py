"""Bad input against the real server: malformed JSON (400 with line and column), invalid
specs (422 naming the JSON path), bodies over 1 MiB (413), unknown routes (404), wrong
methods (405), a missing or wrong token (401), data paths that leave the data directory
(422), and clients that stall mid-request (cut off; they hold no thread meanwhile)."""
import json
import os
import socket
import threading
import time

import pytest
import requests

from pylib.server import raw_http, seed_spec


def err_of(r, status):
    assert r.status_code == status, f"expected {status}, got {r.status_code}: {r.text[:500]}"
    assert r.headers.get("Content-Type", "").startswith("application/json"), r.headers
    e = r.json()["error"]
    assert set(e) >= {"code", "message", "path"} and e["message"], e
    return e


def post_raw(server, body, **kw):
    return server.post("/v1/jobs", data=body, headers={"Content-Type": "application/json"}, **kw)


def no_jobs(server):
    return server.get("/v1/jobs").json()["jobs"] == []


@pytest.mark.parametrize("body,line,column", [
    ('{\n  "name": "x",\n  "world_size": 2,,\n}', 3, 19),
    ('{"name": "x", "world_size": }', 1, None),
    ('{"name": "x"\n\n  "loss": "mse"}', 3, None),
    ('{"name": "x", "model": [', 1, None),
    ('{"a": tru}', 1, None),
    ("{'name': 'x'}", 1, None),
])
def test_malformed_json_is_400_with_line_and_column(server, body, line, column):
    e = err_of(post_raw(server, body.encode()), 400)
    assert e["code"] == "bad_json", e
    m = e["message"]
    assert f"line {line}," in m and "column " in m, m
    if column is not None:
        assert f"column {column}:" in m, m
    assert no_jobs(server)


def test_empty_and_non_object_bodies(server):
    e = err_of(post_raw(server, b""), 400)
    assert "empty" in e["message"], e
    e = err_of(post_raw(server, b"[]"), 422)
    assert "object" in e["message"], e
    e = err_of(post_raw(server, b'{"name": "x"} trailing'), 400)
    assert no_jobs(server)


LONG_MODEL = [{"type": "linear", "in": 10, "out": 10}] + [{"type": "relu"}] * 64 + [
    {"type": "linear", "in": 10, "out": 5}]


@pytest.mark.parametrize("over,path,fragment", [
    ({"bogus": 1}, "bogus", "unknown key"),
    ({"optimiser": {"type": "sgd", "lr": 0.1}}, "optimiser", "optimizer"),
    ({"model": [{"type": "linear", "in": 10, "out": 32}, {"type": "relu"},
                {"type": "linear", "in": 16, "out": 5}]}, "model[2].in", "32"),
    ({"model": None}, "model", "missing"),
    ({"model": [{"type": "conv"}]}, "model[0].type", "conv"),
    ({"model": [{"type": "linear", "in": 10, "out": 5, "bogus": 1}]}, "model[0].bogus", "unknown key"),
    ({"model": [{"type": "linear", "in": 10, "out": 2000000}]}, "model[0].out", "1048576"),
    ({"model": LONG_MODEL}, "model", "64"),
    ({"loss": "hinge"}, "loss", "hinge"),
    ({"optimizer": {"type": "sgd", "lr": -1}}, "optimizer.lr", "-1"),
    ({"optimizer": {"type": "sgd", "lr": 0.1, "momentum": "x"}}, "optimizer.momentum", None),
    ({"world_size": 0}, "world_size", None),
    ({"world_size": 1.5}, "world_size", None),
    ({"batch_size": 0}, "batch_size", None),
    ({"steps": 10}, "steps", "not both"),
    ({"epochs": None}, "epochs", "missing"),
    ({"ddp": {"join": "maybe"}}, "ddp.join", "maybe"),
    ({"data": {"type": "parquet"}}, "data.type", "parquet"),
    ({"data": {"type": "synthetic", "samples": 3000, "seed": 1, "shuffle": "yes"}}, "data.shuffle", None),
    ({"checkpoint": {"every_steps": -5}}, "checkpoint.every_steps", None),
    ({"log_every": 0}, "log_every", None),
    ({"max_restarts": -1}, "max_restarts", None),
    ({"device": "tpu"}, "device", "tpu"),
    ({"name": 1}, "name", "string"),
    ({"world_size": 3}, "world_size", "3"),  # can never fit on 2 CPU slots
])
def test_invalid_spec_is_422_with_path(server, over, path, fragment):
    e = err_of(server.post("/v1/jobs", json=seed_spec(**over)), 422)
    assert e["code"] == "invalid_spec", e
    assert e["path"] == path, e
    if fragment:
        assert fragment in e["message"], e


def _gpt(ln_dim=32, data=None, **over):
    """A tiny GPT (CONTRACT.md §2a) on tokens, with overrides."""
    model = [{"type": "embedding", "num": 65, "dim": 32}, {"type": "position", "max": 16, "dim": 32},
             {"type": "residual", "layers": [{"type": "layernorm", "dim": 32},
                                             {"type": "layernorm", "dim": ln_dim},
                                             {"type": "attention", "dim": 32, "heads": 4}]},
             {"type": "linear", "in": 32, "out": 65}]
    spec = dict(model=model, input_shape=[16], loss="cross_entropy",
                data=data or {"type": "tokens", "path": "train.bin", "block_size": 16})
    spec.update(over)
    return seed_spec(**spec)


CONV = [{"type": "conv2d", "in": 3, "out": 32, "kernel": 3, "padding": 1}, {"type": "relu"},
        {"type": "maxpool2d", "kernel": 2}, {"type": "batchnorm", "features": 32}, {"type": "flatten"},
        {"type": "linear", "in": 256, "out": 10}]


@pytest.mark.parametrize("spec,path,fragment", [
    (_gpt(ln_dim=16), "model[2].layers[1].dim", "expected 32 (the width entering it), got 16"),
    (seed_spec(model=CONV, input_shape=[3, 8, 8], loss="cross_entropy",
               data={"type": "npy", "x": "x.npy", "y": "y.npy"}),
     "model[5].in", "expected 512 (flatten of [32,4,4]), got 256"),
    (_gpt(input_shape=None), "input_shape", "starts with embedding"),
    (_gpt(data={"type": "tokens", "path": "train.bin", "block_size": 8}), "data.block_size",
     "input_shape [8]"),
    (_gpt(data={"type": "synthetic", "samples": 100}), "data.type", "linear layers and activations"),
    (_gpt(eval={"data": {"type": "tokens", "path": "val.bin", "block_size": 16}, "every_steps": 0}),
     "eval.every_steps", "positive integer"),
    (_gpt(optimizer={"type": "adamw", "lr": 0.001, "schedule": {"type": "cosine", "min_lr": 0.1}}),
     "optimizer.schedule.min_lr", "optimizer.lr"),
    (_gpt(grad_clip=-1), "grad_clip", "positive number"),
])
def test_invalid_v2_spec_is_422_with_path(server, spec, path, fragment):
    """The v2 validator over HTTP: the first mismatch of shapes, data, eval, schedule or
    clipping is a 422 naming the JSON path, and no job is made."""
    e = err_of(server.post("/v1/jobs", json=spec), 422)
    assert e["code"] == "invalid_spec", e
    assert e["path"] == path, e
    assert fragment in e["message"], e
    assert no_jobs(server)


def test_cuda_job_on_a_server_without_gpus_is_422(server):
    e = err_of(server.post("/v1/jobs", json=seed_spec(device="cuda")), 422)
    assert "GPU" in e["message"], e
    assert e["path"] in ("device", "world_size"), e


@pytest.mark.parametrize("data,path", [
    ({"type": "npy", "x": "../x.npy", "y": "y.npy"}, "data.x"),
    ({"type": "npy", "x": "x.npy", "y": "../../etc/y.npy"}, "data.y"),
    ({"type": "npy", "x": "sub/../../x.npy", "y": "y.npy"}, "data.x"),
    ({"type": "npy", "x": "/etc/passwd", "y": "y.npy"}, "data.x"),
    ({"type": "npy", "x": "{rank}/../../x.npy", "y": "y.npy"}, "data.x"),
    ({"type": "csv", "path": "../d.csv", "target": "y"}, "data.path"),
])
def test_path_traversal_in_data_paths_is_422(server, data, path):
    e = err_of(server.post("/v1/jobs", json=seed_spec(data=data)), 422)
    assert e["path"] == path, e
    assert no_jobs(server)


@pytest.mark.parametrize("over,path,message", [
    # ESC[2J clears the screen of whoever lists the jobs; ESC ] 0 ; ... BEL retitles the window.
    ({"name": "job-\x1b[2J"}, "name", "control character U+001B at byte 5 is not allowed"),
    ({"name": "\x1b]0;pwned\x07"}, "name", "control character U+001B at byte 1 is not allowed"),
    ({"name": "two\nlines"}, "name", "control character U+000A at byte 4 is not allowed"),
    ({"name": "csi-\u009b2J"}, "name", "control character U+009B at byte 5 is not allowed"),
    ({"data": {"type": "npy", "x": "x\x1b[2J.npy", "y": "y.npy"}}, "data.x",
     "control character U+001B at byte 2 is not allowed"),
])
def test_control_characters_in_spec_strings_are_422(server, over, path, message):
    """Issue 28: text a user submits is shown to others (`ddpd jobs`, the dashboard, error
    messages), so no string of a spec may hold a control character: a 422 naming the field,
    the character and where it is, and no job is made."""
    e = err_of(server.post("/v1/jobs", json=seed_spec(**over)), 422)
    assert e["code"] == "invalid_spec", e
    assert e["path"] == path, e
    assert e["message"] == message, e
    assert no_jobs(server)


def test_names_beyond_ascii_are_kept(server):
    """The rule is on code points, not bytes: 日 is E6 97 A5, whose 0x97 is no C1 control."""
    name = "na\u00efve \u2013 \u65e5\u672c \U0001f680"
    assert server.job(server.submit(seed_spec(name=name))["id"])["name"] == name


def test_path_traversal_in_init_from_is_422(server):
    e = err_of(server.post("/v1/jobs", json=seed_spec(init={"from": "../w.safetensors"})), 422)
    assert e["path"] == "init.from", e


def test_symlink_out_of_the_data_dir_is_422(server):
    import numpy as np
    outside = server.root / "outside_x.npy"
    np.save(outside, np.zeros((4, 10), np.float32))
    np.save(server.data_dir / "y.npy", np.zeros((4, 5), np.float32))
    os.symlink(outside, server.data_dir / "link.npy")
    e = err_of(server.post("/v1/jobs", json=seed_spec(data={"type": "npy", "x": "link.npy", "y": "y.npy"})), 422)
    assert "data.x" in (e["path"] + " " + e["message"]) and "link.npy" in e["message"], (
        f"the error should say that data.x (link.npy) leaves the data directory: {e}")


def test_missing_data_file_names_the_file(server):
    import numpy as np
    np.save(server.data_dir / "y.npy", np.zeros((4, 5), np.float32))
    e = err_of(server.post("/v1/jobs", json=seed_spec(data={"type": "npy", "x": "nope.npy", "y": "y.npy"})), 422)
    assert e["path"].startswith("data"), e
    assert "nope.npy" in e["message"], f"the error should name the missing file: {e}"


def test_body_over_1mib_is_413(server):
    big = b'{"name": "' + b"a" * (2 << 20) + b'"}'
    e = err_of(post_raw(server, big), 413)
    assert e["code"] == "too_large" and "1048576" in e["message"], e
    # Chunked (no Content-Length): found while reading.
    def gen():
        yield b'{"name": "'
        for _ in range(24):
            yield b"a" * 65536  # 1.5 MiB
        yield b'"}'
    e = err_of(post_raw(server, gen()), 413)
    # Just under the limit is read and judged on its content.
    ok = b'{"name": "' + b"a" * ((1 << 20) - 20) + b'"}'
    e = err_of(post_raw(server, ok), 422)
    assert e["path"] == "name", e
    assert no_jobs(server)


@pytest.mark.parametrize("path", ["/v2/jobs", "/v1/job", "/v1/jobs/1/nope", "/v1/jobs/abc", "/v1/jobs/1/2/3",
                                  "/nope", "/v1/jobs/999999", "/v1/jobs/999999/events", "/v1/jobs/999999/metrics",
                                  "/v1/jobs/999999/logs", "/v1/jobs/999999/checkpoint"])
def test_unknown_routes_and_jobs_are_404(server, path):
    e = err_of(server.get(path), 404)
    assert e["code"] == "not_found", e


def test_checkpoint_of_a_job_without_one_is_404(server):
    jid = server.submit(seed_spec(steps=10 ** 7, epochs=None, log_every=10 ** 6))["id"]
    try:
        e = err_of(server.get(f"/v1/jobs/{jid}/checkpoint"), 404)
        assert "checkpoint" in e["message"], e
    finally:
        server.post(f"/v1/jobs/{jid}/cancel")
        server.wait_state(jid, ("cancelled", "failed", "succeeded"), timeout=20)


@pytest.mark.parametrize("method,path,allowed", [
    ("PUT", "/v1/jobs", {"GET", "POST"}),
    ("DELETE", "/v1/jobs", {"GET", "POST"}),
    ("PUT", "/v1/jobs/1", {"GET", "DELETE", "PATCH"}),  # PATCH changes tags and notes (issue 31)
    ("POST", "/v1/jobs/1", {"GET", "DELETE"}),
    ("GET", "/v1/jobs/1/cancel", {"POST"}),
    ("DELETE", "/v1/jobs/1/cancel", {"POST"}),
    ("POST", "/v1/devices", {"GET"}),
    ("POST", "/healthz", {"GET"}),
    ("PUT", "/v1/jobs/1/events", {"GET"}),
])
def test_wrong_methods_are_405_with_allow(server, method, path, allowed):
    e = err_of(server.request(method, path), 405)
    assert e["code"] == "method_not_allowed", e
    allow = {m.strip() for m in server.request(method, path).headers.get("Allow", "").split(",")}
    assert allowed <= allow, allow


def test_token_required_with_token_file(make_server):
    srv = make_server(cpu_slots=2, token="s3cret-t0ken")
    for method, path in [("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/v1/jobs/1"), ("GET", "/v1/devices"),
                         ("GET", "/v1/jobs/1/events"), ("POST", "/v1/jobs/1/cancel"), ("DELETE", "/v1/jobs/1")]:
        kw = {"json": seed_spec()} if method == "POST" and path == "/v1/jobs" else {}
        r = srv.request(method, path, auth=False, **kw)
        assert err_of(r, 401)["code"], r.text
        assert r.headers.get("WWW-Authenticate", "").startswith("Bearer"), (path, r.headers)
        for bad in ["Bearer wrong", "Bearer s3cret-t0ke", "Bearer s3cret-t0ken2", "Basic czNjcmV0LXQwa2Vu",
                    "s3cret-t0ken", "Bearer "]:
            r = srv.request(method, path, auth=False, headers={"Authorization": bad}, **kw)
            err_of(r, 401)
    assert srv.get("/healthz", auth=False).status_code == 200
    assert srv.get("/v1/jobs").status_code == 200
    assert srv.get("/v1/jobs").json()["jobs"] == [], "a job was created without a token"
    j = srv.submit(seed_spec(steps=5, epochs=None))
    assert srv.wait_state(j["id"], ("succeeded",), timeout=30)


def test_token_file_that_is_empty_refuses_to_start(work):
    from pylib.server import Server
    s = Server(work / "bad", token="")
    with pytest.raises(AssertionError, match="exited with 2"):
        s.start(timeout=10)


def _stall_body(port, results, key):
    """Headers promise 100 bytes of body, 10 come, then nothing."""
    t0 = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n" + b'{"name": "')
        got = b""
        while True:
            try:
                b = s.recv(4096)
            except (socket.timeout, ConnectionResetError):
                break
            if not b:
                break
            got += b
        results[key] = (time.monotonic() - t0, got)
    finally:
        s.close()


def _trickle_headers(port, results, key, deadline_s=60):
    """Sends the request line and headers one byte every 2 s (slowloris)."""
    t0 = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port), timeout=3)
    req = b"GET /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 1000
    closed = False
    try:
        for ch in req:
            if time.monotonic() - t0 > deadline_s:
                break
            try:
                s.sendall(bytes([ch]))
                s.settimeout(2)
                b = s.recv(4096)
                if not b:
                    closed = True
                    break
            except socket.timeout:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
    finally:
        s.close()
    results[key] = (time.monotonic() - t0, closed)


def test_slow_clients_are_cut_off(server):
    """Clients that never finish their request hold no thread and are cut off: the server
    cuts a request that is not in within 30 s of the connection (http.c's reaper, request_timeout_ms
    default 30000), with no response. Eight stalled clients (more than the 4 HTTP
    threads) while other requests are served promptly."""
    results = {}
    threads = [threading.Thread(target=_stall_body, args=(server.port, results, f"body{i}"), daemon=True)
               for i in range(6)]
    threads += [threading.Thread(target=_trickle_headers, args=(server.port, results, f"hdr{i}"), daemon=True)
                for i in range(2)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    for _ in range(5):
        t0 = time.monotonic()
        assert server.get("/healthz", timeout=5).status_code == 200
        assert server.get("/v1/jobs", timeout=5).status_code == 200
        assert time.monotonic() - t0 < 2, "stalled clients slow everyone down"
    jid = server.submit(seed_spec(steps=20, epochs=None))["id"]
    assert server.wait_state(jid, ("succeeded",), timeout=30)
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), f"some stalled connections were never cut: {results}"
    for k, v in results.items():
        if k.startswith("body"):
            took, got = v
            assert 5 < took < 45, f"{k}: cut after {took:.1f}s"
            assert got == b"" or got.startswith(b"HTTP/1.1 4"), got[:200]
        else:
            took, closed = v
            assert closed and took < 45, f"{k}: closed={closed} after {took:.1f}s"
    print("stalled clients cut after", {k: round(v[0], 1) for k, v in results.items()},
          "; bodies answered:", {k: v[1][:40] for k, v in results.items() if k.startswith("body")})
    assert server.get("/healthz").status_code == 200


def test_keep_alive_and_raw_requests(server):
    with requests.Session() as s:
        for _ in range(20):
            r = s.get(server.url + "/v1/devices", timeout=5)
            assert r.status_code == 200
    raw = raw_http(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout=5)
    assert raw.startswith(b"HTTP/1.1 200") and b'"ok":true' in raw.replace(b" ", b""), raw[:300]
    raw = raw_http(server.port, b"GARBAGE\r\n\r\n", timeout=5)
    assert raw == b"" or raw.startswith(b"HTTP/1.1 400"), raw[:200]


# ---- issue 15: request framing, query size, chunked bodies (tests/README.md matrix) -------


def _status_of(raw):
    head = raw.split(b"\r\n", 1)[0]
    return int(head.split()[1]) if head.startswith(b"HTTP/1.") else None


def test_duplicate_content_length_is_400(server):
    """Two Content-Length headers used to be read as the first: a body framed one way by
    ddpd and another by a proxy in front of it (request smuggling). Every ambiguous framing
    is 400 and closes the connection; no job is created."""
    spec = json.dumps(seed_spec(steps=3, epochs=None)).encode()
    head = b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    cases = {
        # the first value frames exactly the spec: the old server created the job
        "different": head + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(spec), len(spec) + 9)
        + spec + b"{garbage}",
        "equal": head + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(spec), len(spec)) + spec,
        "with chunked": head + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(spec)
        + b"%x\r\n" % len(spec) + spec + b"\r\n0\r\n\r\n",
    }
    for name, req in cases.items():
        raw = raw_http(server.port, req, timeout=15)
        assert _status_of(raw) == 400, (name, raw[:300])
        body = json.loads(raw.split(b"\r\n\r\n", 1)[1])
        assert body["error"]["code"] == "bad_request" and "Content-Length" in body["error"]["message"], body
        assert b"\r\nConnection: close\r\n" in raw.split(b"\r\n\r\n", 1)[0] + b"\r\n", raw[:300]
    assert no_jobs(server)


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/jobs/1/events", "/healthz"])
def test_many_query_parameters_are_answered_400_at_once(server, path):
    """922+ query parameters got no answer until the 30 s request deadline (libmicrohttpd
    ran out of its per-connection pool parsing them). Past 64 the answer is 400 at once
    (well within the 20 s the client waits here), naming the limit; 64 still work."""
    many = "&".join(f"p{i}=1" for i in range(1000))
    raw = raw_http(server.port, f"GET {path}?{many} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                   .encode(), timeout=20)
    assert _status_of(raw) == 400, raw[:300]
    e = json.loads(raw.split(b"\r\n\r\n", 1)[1])["error"]
    assert e["code"] == "bad_query" and "1000" in e["message"] and "64" in e["message"], e
    assert err_of(server.get("/v1/jobs?" + "&".join(f"p{i}=1" for i in range(65))), 400)["code"] == "bad_query"
    # 64 still work: 64 names on a route that does not check names (a /v1 route takes only
    # its own, test_small_things.py, and none may be given twice)
    assert server.get("/healthz?" + "&".join(f"p{i}=1" for i in range(64))).status_code == 200
    # a target over 8 KiB with a few long parameters: 400 too, at once
    raw = raw_http(server.port, b"GET /v1/jobs?a=" + b"x" * 20000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   b"Connection: close\r\n\r\n", timeout=20)
    assert _status_of(raw) == 400 and b"8192" in raw, raw[:300]


def _chunked_post(server, path, mib, ctype="application/json"):
    def gen():
        yield b'{"name": "'
        for _ in range(mib * 16):
            yield b"a" * 65536
        yield b'"}'
    return server.post(path, data=gen(), headers={"Content-Type": ctype}, timeout=60)


def test_chunked_body_far_over_the_limit_is_413(server):
    """A chunked body more than twice the 1 MiB limit got an empty reply (the connection was
    cut). Now the excess is dropped as it comes and the client gets its 413, also on a
    route that keeps no body (cancel)."""
    e = err_of(_chunked_post(server, "/v1/jobs", 16), 413)
    assert e["code"] == "too_large" and "1048576" in e["message"], e
    e = err_of(_chunked_post(server, "/v1/jobs/1/cancel", 4), 413)
    assert e["code"] == "too_large", e
    assert no_jobs(server)
    assert server.get("/healthz").status_code == 200


@pytest.mark.parametrize("content,why", [
    (b"tok en\n", "whitespace"),
    (b"tok\tx\n", "whitespace"),
    (b"tok\x01en\n", "control byte"),
    (b"first\nsecond\n", "control byte"),
    (b" lead\n", "whitespace"),
    (b"t\xc3\xa9\n", "non-ASCII"),
    (b"a" * 5000 + b"\n", "5000 bytes; the limit is 4095"),
    (b"a" * 9000, "larger than 8192 bytes"),
    (b" \n\t\n", "no token"),
], ids=["space", "tab", "control", "two-lines", "leading-space", "non-ascii", "5000-bytes", "9000-byte-file",
        "blank"])
def test_token_file_that_no_client_can_send_refuses_to_start(work, content, why):
    """A token with whitespace or control bytes inside, or over 4095 bytes (it used to be
    cut there silently), can never be sent back: the server refuses to start (exit 2) with
    a message naming the file and what is wrong."""
    from pylib.server import Server
    s = Server(work / "bad", token="placeholder")
    s.token_file.write_bytes(content)
    with pytest.raises(AssertionError, match="exited with 2"):
        s.start(timeout=10)
    err = s.stderr()
    assert str(s.token_file) in err and why in err, err[-600:]


@pytest.mark.parametrize("content", [b"s3cret  \n\n", b"s3cret\r\n", b"s3cret", b"s3cret\t \n \n"],
                         ids=["spaces-blank-line", "crlf", "no-newline", "tab-space-lines"])
def test_token_file_trailing_whitespace_is_trimmed(make_server, content):
    """Trailing spaces, CRLF or blank lines after the token made a token no client could
    send (every request was 401); they are trimmed."""
    srv = make_server(start=False, token="s3cret")
    srv.token_file.write_bytes(content)
    srv.start()
    assert srv.get("/v1/jobs").status_code == 200
    assert srv.get("/v1/jobs", auth=False).status_code == 401
    assert srv.get("/v1/jobs", auth=False, headers={"Authorization": "Bearer s3cret  "}).status_code == 200


def test_fifo_data_file_is_refused_at_submit_and_in_the_worker(server):
    """A FIFO named as a data file blocked the open until a writer came: the POST waited for
    its planner's 30 s deadline, a rank for ever. Data files are opened O_NONBLOCK and must
    be regular files: 422 at submit, and a failed job (not a hung one) for {rank} files,
    which only the ranks open."""
    import numpy as np
    os.mkfifo(server.data_dir / "fifo.npy")
    os.mkfifo(server.data_dir / "fx_0.npy")
    np.save(server.data_dir / "y.npy", np.zeros((4, 5), np.float32))
    np.save(server.data_dir / "fy_0.npy", np.zeros((4, 5), np.float32))
    t0 = time.monotonic()
    e = err_of(server.post("/v1/jobs", json=seed_spec(data={"type": "npy", "x": "fifo.npy", "y": "y.npy"}),
                           timeout=20), 422)
    assert "fifo.npy" in e["message"] and "not a regular file (a FIFO)" in e["message"], e
    print(f"FIFO refused at submit after {time.monotonic() - t0:.2f} s")
    assert no_jobs(server)
    jid = server.submit(seed_spec(steps=3, epochs=None, data={"type": "npy", "x": "fx_{rank}.npy",
                                                              "y": "fy_{rank}.npy"}))["id"]
    j = server.wait_state(jid, ("failed", "succeeded", "cancelled"), timeout=60)
    assert j["state"] == "failed" and "FIFO" in (j["error"] or ""), j
# ---------------------------------------------------------------------------------------
# sizes from the spec, memory, and what can be checked at submit (issue 15, items 1, 9, 16)


def st_bytes(tensors):
    """A safetensors file of float32 arrays (name -> array)."""
    import json as _json
    import struct as _struct
    import numpy as np
    hdr, off, blobs = {}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype="<f4")
        hdr[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
        blobs.append(a.tobytes())
    h = _json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    return _struct.pack("<Q", len(h)) + h + b"".join(blobs)


@pytest.mark.parametrize("batch_size,samples", [
    (4611686018427387904, 100),   # the report's: (bs * in) * 4 wrapped to a 1-byte buffer
    (9223372036854775807, 9223372036854775807),  # spec_batches overflowed
    (1_000_000_000, 300),         # a batch is at most the shard: no 4 GiB buffer
])
def test_batch_size_beyond_the_data_runs(server, batch_size, samples):
    steps = {"steps": 2, "epochs": None} if samples > 10**6 else {}
    spec = seed_spec(batch_size=batch_size, data={"type": "synthetic", "samples": samples, "seed": 1}, **steps)
    if samples > 10**6:
        e = err_of(server.post("/v1/jobs", json=spec), 422)  # no rank can hold that batch or data
        assert e["path"] in ("batch_size", "data.samples") and "--max-rank-memory" in e["message"], e
        assert "EiB" in e["message"], e
        return
    j = server.submit(spec)
    assert server.wait_state(j["id"], ("succeeded",), timeout=60), server.job(j["id"])
    ev = server.get(f"/v1/jobs/{j['id']}/events?format=ndjson").text
    assert '"batches":1' in ev, ev[:2000]


@pytest.mark.parametrize("model,path", [
    ([{"type": "linear", "in": 1048576, "out": 1048576}], "model"),  # 4 TiB of weights
    ([{"type": "linear", "in": 30000, "out": 30000}, {"type": "relu"},
      {"type": "linear", "in": 30000, "out": 5}], "model"),
])
def test_model_that_cannot_fit_is_422_naming_sizes_and_limit(make_server, model, path):
    import numpy as np
    srv = make_server(cpu_slots=2, extra=["--max-rank-memory", "2G"])
    np.save(srv.data_dir / "x.npy", np.zeros((2, model[0]["in"]), np.float32))
    np.save(srv.data_dir / "y.npy", np.zeros((2, model[-1]["out"]), np.float32))
    spec = seed_spec(model=model, data={"type": "npy", "x": "x.npy", "y": "y.npy"})
    e = err_of(srv.post("/v1/jobs", json=spec), 422)
    assert e["path"] == path, e
    m = e["message"]
    assert "the job needs about" in m and "parameters" in m and "limit of 2.0 GiB per rank" in m, m
    assert "--max-rank-memory" in m, m
    assert no_jobs(srv)


def test_memory_limit_with_data_files_goes_through_the_planner(make_server):
    """npy data: the planner knows the rows; a batch that fills 64 MiB is refused at
    batch_size, the same job with small batches at data, a smaller one runs."""
    import numpy as np
    srv = make_server(cpu_slots=2, extra=["--max-rank-memory", "64M"])
    np.save(srv.data_dir / "x.npy", np.zeros((200000, 10), np.float32))  # 8 MB
    np.save(srv.data_dir / "y.npy", np.zeros((200000, 5), np.float32))
    data = {"type": "npy", "x": "x.npy", "y": "y.npy"}
    model = [{"type": "linear", "in": 10, "out": 4096}, {"type": "relu"}, {"type": "linear", "in": 4096, "out": 5}]
    e = err_of(srv.post("/v1/jobs", json=seed_spec(model=model, data=data, batch_size=200000)), 422)
    assert e["path"] == "batch_size", e
    assert "micro-batches of 200000 rows" in e["message"] and "64.0 MiB" in e["message"], e
    np.save(srv.data_dir / "xb.npy", np.zeros((2_000_000, 10), np.float32))  # 80 MB
    np.save(srv.data_dir / "yb.npy", np.zeros((2_000_000, 5), np.float32))
    e = err_of(srv.post("/v1/jobs", json=seed_spec(data={"type": "npy", "x": "xb.npy", "y": "yb.npy"})), 422)
    assert e["path"] == "data", e
    assert no_jobs(srv)
    j = srv.submit(seed_spec(data=data, batch_size=1000, log_every=50))
    assert srv.wait_state(j["id"], ("succeeded",), timeout=60), srv.job(j["id"])


def test_synthetic_model_over_the_teachers_cap_is_422(server):
    e = err_of(server.post("/v1/jobs", json=seed_spec(model=[{"type": "linear", "in": 30000, "out": 30000},
                                                              {"type": "relu"},
                                                              {"type": "linear", "in": 30000, "out": 5}])), 422)
    assert e["path"] == "data.type" and "268435456" in e["message"] and "900150000" in e["message"], e
    assert no_jobs(server)


def test_rank_in_x_but_not_y_is_422(server):
    import numpy as np
    for r in range(2):
        np.save(server.data_dir / f"x{r}.npy", np.zeros((4, 10), np.float32))
    np.save(server.data_dir / "y.npy", np.zeros((4, 5), np.float32))
    e = err_of(server.post("/v1/jobs", json=seed_spec(world_size=2, data={"type": "npy", "x": "x{rank}.npy",
                                                                             "y": "y.npy"})), 422)
    assert e["path"] == "data.y" and "{rank}" in e["message"], e
    e = err_of(server.post("/v1/jobs", json=seed_spec(data={"type": "npy", "x": "x0.npy", "y": "y{rank}.npy"})),
               422)
    assert e["path"] == "data.x", e
    assert no_jobs(server)


@pytest.mark.parametrize("tensors,words", [
    ({"0.weight": (5, 11), "0.bias": (5,)}, ['"0.weight"', "[5, 11]", "[5, 10]"]),   # wrong shape
    ({"0.weight": (5, 10)}, ['"0.bias"', "no tensor"]),                              # missing
    ({"0.weight": (5, 10), "0.bias": (5,), "2.weight": (3, 5)}, ['"2.weight"', "not a parameter"]),
    ({"0.weight": (5, 10), "0.bias": (4,)}, ['"0.bias"', "[4]", "[5]"]),
])
@pytest.mark.parametrize("synthetic", [True, False])
def test_init_from_that_does_not_fit_the_model_is_422(server, tensors, words, synthetic):
    import numpy as np
    (server.data_dir / "w.safetensors").write_bytes(
        st_bytes({k: np.zeros(v, np.float32) for k, v in tensors.items()}))
    spec = seed_spec(init={"from": "w.safetensors"})
    if not synthetic:
        np.save(server.data_dir / "x.npy", np.zeros((6, 10), np.float32))
        np.save(server.data_dir / "y.npy", np.zeros((6, 5), np.float32))
        spec["data"] = {"type": "npy", "x": "x.npy", "y": "y.npy"}
    e = err_of(server.post("/v1/jobs", json=spec), 422)
    assert e["path"] == "init.from", e
    for w in words:
        assert w in e["message"], (w, e)
    assert "w.safetensors" in e["message"] and str(server.data_dir) not in e["message"], e
    assert no_jobs(server)
    # The same file with the right shapes is accepted and used.
    (server.data_dir / "w.safetensors").write_bytes(
        st_bytes({"0.weight": np.ones((5, 10), np.float32), "0.bias": np.zeros(5, np.float32)}))
    j = server.submit(spec)
    assert server.wait_state(j["id"], ("succeeded",), timeout=60), server.job(j["id"])


@pytest.mark.parametrize("kind", ["npy_i64", "npy_i32_negative", "csv", "csv_text"])
def test_bad_values_in_data_files_are_422_at_submit(server, kind):
    import numpy as np
    model = [{"type": "linear", "in": 3, "out": 4}]
    if kind.startswith("npy"):
        np.save(server.data_dir / "x.npy", np.zeros((50, 3), np.float32))
        y = np.arange(50) % 4
        y[37] = 4 if kind == "npy_i64" else -2
        np.save(server.data_dir / "y.npy", y.astype(np.int64 if kind == "npy_i64" else np.int32))
        data, words = {"type": "npy", "x": "x.npy", "y": "y.npy"}, ["y.npy", "row 37", "[0, 4)"]
    else:
        rows = ["a,b,c,label"] + [f"1,2,3,{i % 4}" for i in range(30)]
        rows[21] = "1,2,3,9" if kind == "csv" else "1,two,3,1"
        (server.data_dir / "d.csv").write_text("\n".join(rows) + "\n")
        data = {"type": "csv", "path": "d.csv", "target": "label"}
        words = ["d.csv", "line 22", "[0, 4)" if kind == "csv" else '"two" is not a number']
    e = err_of(server.post("/v1/jobs", json=seed_spec(model=model, loss="cross_entropy", data=data)), 422)
    assert e["path"].startswith("data"), e
    for w in words:
        assert w in e["message"], (w, e)
    assert no_jobs(server)


def test_rank_killed_by_a_sigkill_nobody_sent_is_reported_as_likely_oom(server):
    """The kernel's OOM killer sends SIGKILL; the launcher, which did not send it and
    cannot read the kernel log, names the likely cause and what the job needed."""
    import re
    import signal
    from pylib.server import FOREVER_STEPS, heavy_spec
    jid = server.submit(heavy_spec(1, steps=FOREVER_STEPS, name="oom"))["id"]
    j = server.wait_running(jid)
    os.kill(j["ranks"][0]["pid"], signal.SIGKILL)
    j = server.wait_state(jid, ("failed",), timeout=30)
    err = j["error"] or ""
    assert "killed by signal 9" in err and "likely the out-of-memory killer" in err, err
    m = re.search(r"the job needed about (\d+\.\d) MiB per rank\)", err)
    assert m and float(m.group(1)) > 0.1, err
    print(err)


# ---------------------------------------------------------------------------------------
# tokens data (issue 17, CONTRACT.md §2a): what the planner checks at submit


def _gpt_spec(data, T=8):
    """A tiny GPT-shaped job on token ids."""
    return seed_spec(model=[{"type": "embedding", "num": 256, "dim": 8},
                            {"type": "position", "max": T, "dim": 8},
                            {"type": "linear", "in": 8, "out": 256}],
                     input_shape=[T], loss="cross_entropy", data=data, batch_size=2)


def test_tokens_file_shorter_than_one_window_is_422_naming_it(server):
    """A tokens file needs block_size + 1 ids for one sample: a shorter one is refused at
    submit, naming the file; so is a size that is not a whole number of ids, and an id
    outside the vocabulary (naming the sample and the position)."""
    import numpy as np
    np.arange(8, dtype=np.uint16).tofile(server.data_dir / "short.bin")  # T + 1 = 9 needed
    e = err_of(server.post("/v1/jobs", json=_gpt_spec({"type": "tokens", "path": "short.bin",
                                                        "block_size": 8})), 422)
    assert "short.bin: too short: 8 tokens" in e["message"], e
    (server.data_dir / "odd.bin").write_bytes(b"\0" * 41)
    e = err_of(server.post("/v1/jobs", json=_gpt_spec({"type": "tokens", "path": "odd.bin",
                                                        "block_size": 8})), 422)
    assert "odd.bin: its size, 41 bytes, is not a multiple of 2" in e["message"], e
    ids = np.arange(40, dtype=np.uint16)
    ids[19] = 300
    ids.tofile(server.data_dir / "bad.bin")
    e = err_of(server.post("/v1/jobs", json=_gpt_spec({"type": "tokens", "path": "bad.bin",
                                                        "block_size": 8})), 422)
    assert "bad.bin: id 300 at sample 2, position 3 is out of range [0, 256)" in e["message"], e
    assert no_jobs(server)
    np.arange(40, dtype=np.uint16).tofile(server.data_dir / "ok.bin")
    r = server.post("/v1/jobs", json=_gpt_spec({"type": "tokens", "path": "ok.bin", "block_size": 8}))
    assert r.status_code == 201, r.text


def test_tokens_id_out_of_range_in_a_large_file_fails_the_job_naming_it(server):
    """Over 1 GiB the planner leaves the ids to the ranks, which read the file mapped, window
    by window: the rank that reads a bad id ends the job (exit 2, kind data) naming the file,
    the sample and the position. The file is sparse: it costs no disk and no memory."""
    with open(server.data_dir / "big.bin", "wb") as f:
        f.truncate((1 << 30) + 4096)
        f.seek(2 * 70)  # token 70: sample 1 (rank 1's first), position 6
        f.write((300).to_bytes(2, "little"))
    spec = _gpt_spec({"type": "tokens", "path": "big.bin", "block_size": 64, "shuffle": False}, T=64)
    spec.update(world_size=2, steps=3)
    spec.pop("epochs")
    jid = server.submit(spec)["id"]
    j = server.wait_state(jid, ("failed", "succeeded", "cancelled"), timeout=60)
    assert j["state"] == "failed", j
    assert "big.bin: id 300 at sample 1, position 6 is out of range [0, 256)" in (j["error"] or ""), j
