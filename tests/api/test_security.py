"""Security of the real server (tests/README.md, "Threats and tests"): the environment a
job's processes get is an allow-list of the server's (server/env.c), the bearer token never
lands in a log, a response or a worker, oversized request headers are refused without
hurting anyone else, and one address cannot hold more than its share of connections.
Route-by-route auth over the real route table is tests/unit/server/test_server_auth.c."""
import os
import re
import socket
import time

from pylib.server import FOREVER_STEPS, heavy_spec, seed_spec, wait_until

# What server/env.c lets through: exact names and prefixes. Kept here on purpose (not read
# from the C file): a change to the list must change this test too, in review.
ALLOWED_NAMES = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH"}
ALLOWED_PREFIXES = ("LC_", "OMP_", "OPENBLAS_", "GOTO_", "MKL_", "CUDA_", "NVIDIA_", "NCCL_", "DDPD_",
                    "SLURM_", "ASAN_", "UBSAN_", "TSAN_", "LSAN_")

SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "aws-s3cr3t-9f1c2e",
    "DATABASE_PASSWORD": "db-s3cr3t-77aa",
    "GITHUB_TOKEN": "ghp_s3cr3t0123456789",
    "LD_PRELOAD": "",  # empty: harmless in the server, and must not reach a worker either
    "OMPX_NOT_OMP": "ompx-secret-value",  # a near miss of the OMP_ prefix
}


def environ_of(pid):
    raw = open(f"/proc/{pid}/environ", "rb").read()
    return dict(e.split(b"=", 1) for e in raw.split(b"\0") if b"=" in e)


def allowed(name):
    return name in ALLOWED_NAMES or any(name.startswith(p) and len(name) > len(p) for p in ALLOWED_PREFIXES)


def test_worker_environment_is_an_allow_list(make_server):
    """A job's ranks and its id issuer see the allow-listed part of the server's
    environment and nothing else: secrets set on the server are not in
    /proc/<pid>/environ of any process the server started."""
    env = dict(SECRETS, LC_ALL="C.UTF-8", NCCL_DEBUG="WARN", DDPD_COMM_SHM="1", OPENBLAS_VERBOSE="0")
    srv = make_server(cpu_slots=2, env=env)
    jid = srv.submit(heavy_spec(world_size=2, steps=FOREVER_STEPS))["id"]
    try:
        srv.wait_running(jid, timeout=60)
        pids = wait_until(lambda: (lambda w: w if len(w) >= 3 else None)(srv.note_workers()), 20,
                          "two ranks and the id issuer among the server's children")
        server_env = environ_of(srv.pid())
        for k, v in SECRETS.items():
            assert server_env.get(k.encode()) == v.encode(), f"the test did not reach the server: {k}"
        seen = []
        for pid in pids:
            e = environ_of(pid)
            names = sorted(k.decode() for k in e)
            seen.append((pid, names))
            leaked = sorted(n for n in names if not allowed(n))
            assert not leaked, f"worker {pid} got variables outside the allow-list: {leaked}"
            for k in SECRETS:
                assert k.encode() not in e, f"worker {pid} got {k}"
            blob = b"\0".join(e.values())
            for v in SECRETS.values():
                assert not v or v.encode() not in blob, f"worker {pid} got a secret's value"
            # What workers need does cross.
            assert e.get(b"OMP_NUM_THREADS") == b"1" and e.get(b"LC_ALL") == b"C.UTF-8", names
            assert e.get(b"NCCL_DEBUG") == b"WARN" and e.get(b"DDPD_COMM_SHM") == b"1", names
            assert e.get(b"PATH") == server_env.get(b"PATH"), names
        print("worker environments:", seen)
    finally:
        srv.post(f"/v1/jobs/{jid}/cancel")
        srv.wait_state(jid, ("cancelled", "failed", "succeeded"), timeout=30)


def test_token_is_never_logged_or_echoed(make_server):
    """With a token file: right and wrong tokens (the right one with a byte more or less,
    in every Authorization form) go through every kind of request; afterwards the token's
    text is in no file under the server's folder but the token file (stderr, database,
    WAL, job logs, issuer log) and in no response."""
    token = "tok-9c41e7d2b5a84f06-s3cret"
    srv = make_server(cpu_slots=2, token=token)
    bodies = []
    for auth in [None, f"Bearer {token}x", f"Bearer {token[:-1]}", f"Basic {token}", token, f"bearer {token}"]:
        hdr = {"Authorization": auth} if auth else {}
        for method, path in [("GET", "/v1/jobs"), ("GET", "/v1/jobs/1"), ("POST", "/v1/jobs"),
                             ("GET", "/v1/jobs/1/logs"), ("GET", "/nope"), ("GET", "/metrics")]:
            r = srv.request(method, path, auth=False, headers=hdr, json={"name": 1} if method == "POST" else None)
            bodies.append(r.text + str(r.headers))
    jid = srv.submit(seed_spec(world_size=2, name="tok"))["id"]
    srv.wait_state(jid, ("succeeded",), timeout=60)
    for path in [f"/v1/jobs/{jid}", f"/v1/jobs/{jid}/events?format=ndjson", f"/v1/jobs/{jid}/logs",
                 f"/v1/jobs/{jid}/logs?rank=1", "/metrics", "/v1/devices", "/healthz"]:
        bodies.append(srv.get(path).text)
    for b in bodies:
        assert token not in b, f"a response holds the token: {b[:300]}"
    srv.stop()
    needle = token.encode()
    scanned = 0
    for dirpath, _, files in os.walk(srv.root):
        for f in files:
            p = os.path.join(dirpath, f)
            if os.path.samefile(p, srv.token_file):
                continue
            scanned += 1
            with open(p, "rb") as fh:
                assert needle not in fh.read(), f"the token is in {p}"
    assert scanned >= 5, f"only {scanned} files under {srv.root}"
    print(f"token in none of {len(bodies)} responses and {scanned} files")


def test_init_from_symlink_out_of_the_data_dir_fails_the_job(server):
    """init.from is a data path too: a symbolic link in the data directory that leads out of
    it is refused (the ranks used to load whatever it pointed at), at submit, saying so; a
    file inside loads."""
    import struct
    import json as _json
    hdr = _json.dumps({"0.weight": {"dtype": "F32", "shape": [5, 10], "data_offsets": [0, 200]},
                       "0.bias": {"dtype": "F32", "shape": [5], "data_offsets": [200, 220]}}).encode()
    blob = struct.pack("<Q", len(hdr)) + hdr + bytes(220)
    outside = server.root / "outside.safetensors"
    outside.write_bytes(blob)
    (server.data_dir / "inside.safetensors").write_bytes(blob)
    os.symlink(outside, server.data_dir / "w.safetensors")
    # Found at submit since the planner checks init.from (issue 15, item 16); the ranks
    # check it again (unit.test_data test_paths).
    r = server.post("/v1/jobs", json=seed_spec(init={"from": "w.safetensors"}))
    assert r.status_code == 422, r.text
    e = r.json()["error"]
    assert e["path"] == "init.from" and "leaves the data directory" in e["message"], e
    print("init.from through a link:", e["message"])
    ok = server.submit(seed_spec(init={"from": "inside.safetensors"}))["id"]
    assert server.wait_state(ok, ("failed", "succeeded"), timeout=60)["state"] == "succeeded"


def _raw(port, data, timeout=10):
    """Sends `data` and returns whatever comes back until the server closes (or b"" when it
    refused or reset the connection)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    got = b""
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return b""
        while True:
            try:
                b = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not b:
                break
            got += b
    finally:
        s.close()
    return got


def test_oversized_headers_are_refused(server):
    """One 100 KiB header line, 3000 small headers (96 KiB), and a 70 KiB request line:
    each is answered with a 4xx (or the connection is closed) without a 2xx, quickly,
    and the server serves everyone else meanwhile (64 KiB per connection,
    http_config.memory_limit)."""
    cases = {
        "one huge header": b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (100 << 10) + b"\r\n\r\n",
        "many headers": b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                        + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 20) for i in range(3000)) + b"\r\n",
        "huge request line": b"GET /v1/jobs?state=" + b"q" * (70 << 10) + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    }
    for what, req in cases.items():
        t0 = time.monotonic()
        got = _raw(server.port, req)
        took = time.monotonic() - t0
        status = re.match(rb"HTTP/1\.[01] (\d{3})", got)
        assert got == b"" or (status and 400 <= int(status.group(1)) < 500), (what, got[:200])
        assert took < 5, f"{what}: {took:.1f} s"
        assert server.get("/healthz", timeout=5).status_code == 200, what
        print(what, "->", status.group(1).decode() if status else "closed", f"in {took:.2f} s")


def test_per_ip_connection_limit(server):
    """One address holds at most 256 connections (http_config.per_ip_limit's default):
    of 300 idle connections from 127.0.0.1, the server closes the ones past the limit
    at once, and serves again as soon as they go."""
    socks = []
    try:
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            socks.append(s)
        time.sleep(1.0)
        closed = 0
        for s in socks:
            s.setblocking(False)
            try:
                if s.recv(1) == b"":
                    closed += 1
            except BlockingIOError:
                pass
            except ConnectionResetError:
                closed += 1
        print(f"{closed} of 300 connections closed by the server")
        assert closed >= 300 - 256, f"only {closed} of 300 were refused: no per-address limit"
        assert closed <= 300 - 200, f"{closed} were refused: the limit is lower than documented"
    finally:
        for s in socks:
            s.close()
    assert wait_until(lambda: _healthz_ok(server), 10, "the server to serve again")


def _healthz_ok(server):
    try:
        return server.get("/healthz", timeout=2).status_code == 200
    except Exception:
        return False


# ---- issue 15 item 3: cross-site requests on a tokenless loopback server ---------------

def _err(r, status):
    assert r.status_code == status, f"expected {status}, got {r.status_code}: {r.text[:400]}"
    return r.json()["error"]


def test_cross_site_requests_are_refused(server):
    """Any page the user visits could submit and cancel jobs on a tokenless server (a form
    or text/plain post needs no preflight), and a DNS name rebound to 127.0.0.1 read the
    API. A JSON body needs its content type (415), a state-changing request from a foreign
    origin is 403, and without a token /v1 answers only loopback Host names (403)."""
    import json
    body = json.dumps(seed_spec(steps=3, epochs=None))
    for ctype in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None]:
        h = {"Content-Type": ctype} if ctype else {}
        r = server.request("POST", "/v1/jobs", data=body, headers=h)
        e = _err(r, 415)
        assert e["code"] == "unsupported_media_type" and "application/json" in e["message"], e
    for h in [{"Origin": "http://evil.example"}, {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"},
              {"Origin": f"http://localhost:{server.port + 1}"}]:
        e = _err(server.post("/v1/jobs", json=seed_spec(steps=3, epochs=None), headers=h), 403)
        assert e["code"] == "forbidden", (h, e)
    assert server.get("/v1/jobs").json()["jobs"] == [], "a cross-site request created a job"

    # the dashboard's own origin may submit; a foreign one may not cancel or delete it
    same = {"Origin": f"http://127.0.0.1:{server.port}", "Sec-Fetch-Site": "same-origin"}
    r = server.post("/v1/jobs", json=seed_spec(steps=FOREVER_STEPS, epochs=None, log_every=10 ** 6), headers=same)
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    for method, path in [("POST", f"/v1/jobs/{jid}/cancel"), ("DELETE", f"/v1/jobs/{jid}")]:
        e = _err(server.request(method, path, headers={"Origin": "http://evil.example"}), 403)
        assert "evil.example" in e["message"], e
        _err(server.request(method, path, headers={"Sec-Fetch-Site": "same-site"}), 403)
    assert server.job(jid)["state"] in ("queued", "starting", "running")

    # DNS rebinding: the page's own name arrives as Host
    for host in ["evil.example", f"evil.example:{server.port}", f"localhost.evil.example:{server.port}",
                 f"127.0.0.1.nip.io:{server.port}"]:
        for path in ["/v1/jobs", f"/v1/jobs/{jid}", f"/v1/jobs/{jid}/logs", f"/v1/jobs/{jid}/checkpoint"]:
            e = _err(server.get(path, headers={"Host": host}), 403)
            assert e["code"] == "forbidden" and "Host" in e["message"], (host, path, e)
    for host in [f"localhost:{server.port}", f"127.0.0.1:{server.port}", f"127.4.5.6:{server.port}", "localhost"]:
        assert server.get("/v1/jobs", headers={"Host": host}).status_code == 200, host
    assert server.get("/healthz", headers={"Host": "evil.example"}).status_code == 200

    assert server.post(f"/v1/jobs/{jid}/cancel", headers=same).status_code == 202
    assert server.wait_state(jid, ("cancelled",), timeout=30)


def test_cors_origin_and_token_relax_the_site_checks(make_server):
    """--cors-origin names the one foreign origin that may change state; with a token any
    Host name is served (the token guards the API, not the name)."""
    srv = make_server(cpu_slots=2, token="t0ken-x", extra=["--cors-origin", "http://app.example"])
    r = srv.post("/v1/jobs", json=seed_spec(steps=3, epochs=None), headers={"Origin": "http://app.example"})
    assert r.status_code == 201, r.text
    assert r.headers.get("Access-Control-Allow-Origin") == "http://app.example"
    # A cross-origin dashboard reads a 503's Retry-After (the inference queue is full).
    assert r.headers.get("Access-Control-Expose-Headers") == "Retry-After"
    _err(srv.post("/v1/jobs", json=seed_spec(steps=3, epochs=None), headers={"Origin": "http://other.example"}),
         403)
    assert srv.get("/v1/jobs", headers={"Host": "ddpd.internal.example:8080"}).status_code == 200
    assert srv.get("/v1/jobs", auth=False, headers={"Host": "ddpd.internal.example:8080"}).status_code == 401
