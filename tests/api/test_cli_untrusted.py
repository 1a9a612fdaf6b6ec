"""test_cli_untrusted.py — `ddpd` as a client (server/client.c) trusts nothing the network
says (issue 28, items 2 and 4).

Item 2: every string from a server or a job reaches the terminal escaped (server/termsafe.c):
no raw ESC, BEL, DEL, C1 control (U+009B as UTF-8 or the byte 0x9b) or byte that is not
UTF-8 on the CLI's stdout or stderr, for every command, against a real `ddpd serve` (a job
named with a screen clear and a window title, a data file name with ESC) and against a fake
server on 127.0.0.1 whose job lists, jobs, events, logs and error bodies are full of escape
sequences. What is escaped stays visible (`\\x1b[2J`), and JSON output stays JSON of the same
value.

Item 4: `ddpd pull` keeps a download only when it is whole and a valid safetensors file:
a body without Content-Length that never ends is refused at --max-bytes, a body shorter
than its Content-Length, one past the checkpoints list's bytes, a truncated file, a header
that is not JSON and offsets out of range are refused, and none leaves a file behind; a
good file is written with a new file's mode. A pull ended by SIGINT, SIGTERM or SIGHUP mid-download
leaves no temporary file.

Every client run has a timeout; the fake server stops sending after a bounded number of bytes.
"""
import http.server
import json
import os
import signal
import socketserver
import stat
import subprocess
import threading
import time

import numpy as np
import pytest

from pylib.common import bin_dir
from pylib.safetensors import st_decode, st_encode
from pylib.server import seed_spec

# What a hostile server or job puts in its strings: a screen clear, a window title ended
# by BEL, colours, CSI as C1 (U+009B), DEL, backspace, a carriage return and a newline.
HOSTILE = "\x1b[2J\x1b]0;pwned\x07\x1b[31mred\u009b32mgreen\x7fdel\x08\rcr\nnl"
# The same as raw bytes for bodies that are not JSON: CSI as one byte, invalid UTF-8, NUL.
HOSTILE_BYTES = b"\x1b[2J\x1b]0;pwned\x07\x9b31m\xc2\x9b32m\x7f\x08\r\x00\xff\xfe end"


def ddpd():
    b = bin_dir()
    if b is None:
        pytest.skip("ddpd is not built (set DDPD_BIN to the build folder)")
    return str(b / "ddpd")


def cli(url, *args, timeout=60, cwd=None, token=None):
    """`ddpd ARGS` against url; CompletedProcess with bytes (what a terminal would get)."""
    e = dict(os.environ, DDPD_SERVER=url)
    e.pop("DDPD_TOKEN", None)
    if token:
        e["DDPD_TOKEN"] = token
    return subprocess.run([ddpd(), *args], env=e, capture_output=True, timeout=timeout, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def assert_inert(data, what, keep="\n"):
    """data (bytes) holds nothing a terminal acts on: valid UTF-8, no C0 control but
    `keep`, no DEL, no C1 control."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise AssertionError(f"{what}: not UTF-8 ({e}): {data[:400]!r}")
    bad = sorted({hex(ord(ch)) for ch in text if (ord(ch) < 0x20 and ch not in keep) or 0x7F <= ord(ch) <= 0x9F})
    assert not bad, f"{what}: raw control characters {bad} reach the terminal: {data[:400]!r}"


def assert_run_inert(r, what, stdout_keep="\n"):
    assert_inert(r.stdout, f"{what}: stdout", stdout_keep)
    assert_inert(r.stderr, f"{what}: stderr")


# ---------------------------------------------------------------------------------------
# the fake server


class FakeServer:
    """An HTTP server on 127.0.0.1 (an ephemeral port, its own thread) answering each
    request from `routes`: {(method, path without query): answer}, an answer being
    (status, headers, body) with body bytes (sent with its Content-Length unless headers
    has "Content-Length": None) or a function that writes the body (no Content-Length:
    the body ends when the connection closes). A route not listed answers `default`."""

    def __init__(self, routes, default=None):
        fake = self
        self.routes = routes
        self.default = default or (404, {"Content-Type": "application/json"},
                                    json.dumps({"error": {"code": "not_found", "message": "no route"}}).encode())
        self.requests = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # one request a connection; a body may end at close

            def answer(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                path = self.path.split("?", 1)[0]
                fake.requests.append((self.command, self.path))
                status, headers, body = fake.routes.get((self.command, path), fake.default)
                self.send_response(status)
                headers = dict(headers)
                if isinstance(body, bytes) and "Content-Length" not in headers:
                    headers["Content-Length"] = str(len(body))
                for k, v in headers.items():
                    if v is not None:
                        self.send_header(k, v)
                self.end_headers()
                try:
                    if isinstance(body, bytes):
                        self.wfile.write(body)
                    else:
                        body(self.wfile)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up: what the pull tests want

            do_GET = do_POST = do_DELETE = answer

            def log_message(self, *a):
                pass

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake_server():
    made = []

    def make(routes, default=None):
        f = FakeServer(routes, default)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()


def js(status, obj):
    return (status, {"Content-Type": "application/json"}, json.dumps(obj).encode())


def hostile_error(status, code="not_found"):
    return js(status, {"error": {"code": code + HOSTILE, "message": "bad " + HOSTILE, "path": "name" + HOSTILE}})


HOSTILE_JOB = {"id": 1, "name": "job" + HOSTILE, "state": "failed", "step": 3, "loss": 0.5,
               "created_at": 1.0, "error": "data: x" + HOSTILE + ".npy: no such file",
               "tags": ["t" + HOSTILE], "spec": {"name": "job" + HOSTILE, "steps": 10}}


def sse(*frames):
    def write(w):
        for f in frames:
            w.write(f)
    return (200, {"Content-Type": "text/event-stream", "Content-Length": None}, write)


def event_frame(seq, ev):
    # DEL and C1 raw in the JSON text (valid JSON), the C0 controls as \u escapes.
    return f"id: {seq}\nevent: {ev['event']}\ndata: {json.dumps(ev, ensure_ascii=False)}\n\n".encode()


EVENTS = [
    {"seq": 1, "event": "log", "rank": 0, "message": "data file x" + HOSTILE + ".npy"},
    {"seq": 2, "event": "loss", "rank": 0, "step": 1, "loss": 0.10000, "samples_per_s": 5.0, "ts": 1.5},
    {"seq": 3, "event": "state", "state": "failed", "error": "data: x" + HOSTILE + ".npy: no such file"},
]


def content_routes():
    """A server whose answers succeed, with hostile strings in them."""
    # DEL and C1 raw inside JSON strings, which JSON allows (json.dumps escapes only C0).
    raw_job = json.dumps(HOSTILE_JOB, ensure_ascii=False).encode()
    return {
        ("GET", "/v1/jobs"): js(200, {"jobs": [HOSTILE_JOB, dict(HOSTILE_JOB, id=2, state="running" + HOSTILE)],
                                      "next": None}),
        ("GET", "/v1/jobs/1"): (200, {"Content-Type": "application/json"}, raw_job),
        ("GET", "/v1/jobs/1/events"): sse(event_frame(1, EVENTS[0]), event_frame(2, EVENTS[1]),
                                          b"event: loss\ndata: not json " + HOSTILE_BYTES + b"\n\n",
                                          event_frame(3, EVENTS[2])),
        ("GET", "/v1/jobs/1/logs"): (200, {"Content-Type": "text/plain"},
                                     b"line 1\n\tindented " + HOSTILE_BYTES + b"\nlast line " +
                                     HOSTILE.encode() + b"\n"),
        ("GET", "/v1/jobs/1/checkpoints"): js(200, {"checkpoints": [{"step": 5, "time": 1.0, "bytes": 100,
                                                                     "note": HOSTILE}]}),
        ("POST", "/v1/jobs"): hostile_error(422, "invalid_spec"),
        ("POST", "/v1/jobs/1/cancel"): hostile_error(409, "conflict"),
        ("DELETE", "/v1/jobs/1"): hostile_error(409, "conflict"),
        ("GET", "/v1/jobs/1/checkpoint"): hostile_error(404),
        ("GET", "/v1/queue"): js(200, {
            "running": [{"id": 1, "name": "run" + HOSTILE, "owner": "al" + HOSTILE, "priority": 50,
                         "preemptible": True, "device": "cpu" + HOSTILE, "world_size": 1, "slots": [0],
                         "state": "running", "running_s": 5.0, "time_limit": None, "preempting": False}],
            "pending": [{"id": 2, "name": "wait" + HOSTILE, "owner": None, "priority": 50, "effective_priority": 55,
                         "device": "cpu", "world_size": 1, "state": "queued" + HOSTILE, "waited_s": 3.0,
                         "position": 1, "reason": "why" + HOSTILE}],
            "pending_total": 1, "slots": {"gpus": 0, "cpu": 1}}),
    }


def every_command(work):
    spec = work / "spec.json"
    spec.write_text(json.dumps(seed_spec()))
    return [["jobs"], ["show", "1"], ["watch", "1"], ["logs", "1"], ["logs", "-f", "1"], ["checkpoints", "1"],
            ["submit", str(spec)], ["submit", "--follow", str(spec)], ["cancel", "1"], ["rm", "1"],
            ["pull", "1", "-o", str(work / "m.safetensors")],
            ["pull", "1", "--step", "5", "-o", str(work / "m.safetensors")], ["queue"], ["queue", "--json"]]


def test_every_command_escapes_what_a_fake_server_says(fake_server, work):
    fake = fake_server(content_routes())
    for args in every_command(work):
        r = cli(fake.url, *args)
        assert_run_inert(r, "ddpd " + " ".join(args), stdout_keep="\n\t" if args[0] == "logs" else "\n")
    assert not (work / "m.safetensors").exists()

    # What was escaped is shown, not dropped.
    r = cli(fake.url, "jobs")
    assert r.returncode == 0, r.stderr
    rows = r.stdout.decode().splitlines()
    assert len(rows) == 3 and rows[1].split()[1].startswith("job\\x1b[2J\\x1b]0"), rows
    assert "running\\x1b[2J" in rows[2], rows
    r = cli(fake.url, "queue")
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert "run\\x1b[2J" in out and "why\\x1b[2J\\x1b]0;pwned" in out and "50 (+5)" in out, out
    r = cli(fake.url, "logs", "1")
    assert r.returncode == 0
    out = r.stdout.decode()
    assert out.startswith("line 1\n\tindented \\x1b[2J\\x1b]0;pwned\\x07\\x9b31m\\u009b32m\\x7f\\x08\\r\\x00\\xff\\xfe end\n")
    assert out.endswith("last line \\x1b[2J\\x1b]0;pwned\\x07\\x1b[31mred\\u009b32mgreen\\x7fdel\\x08\\rcr\nnl\n"), out
    r = cli(fake.url, "submit", str(work / "spec.json"))
    assert r.returncode == 2
    err = r.stderr.decode()
    assert "name\\x1b[2J" in err and "bad \\x1b[2J\\x1b]0;pwned\\x07" in err and "HTTP 422" in err, err

    # JSON output is JSON of the same value: `show` pretty-printed, `watch` one event a line.
    r = cli(fake.url, "show", "1")
    assert r.returncode == 0 and json.loads(r.stdout) == HOSTILE_JOB, r.stdout
    r = cli(fake.url, "watch", "1")
    assert r.returncode == 1
    assert [json.loads(ln) for ln in r.stdout.decode().splitlines()] == EVENTS, r.stdout
    err = r.stderr.decode()
    assert "that is not JSON: not json \\x1b[2J" in err, err
    assert "job 1 failed: data: x\\x1b[2J\\x1b]0;pwned\\x07" in err, err


def test_every_command_escapes_error_bodies(fake_server, work):
    """Error answers that are not JSON, with raw control bytes, and JSON error answers
    full of escapes, to every command."""
    raw = (500, {"Content-Type": "text/plain"}, b"internal " + HOSTILE_BYTES)
    for default in (raw, hostile_error(500, "internal"), hostile_error(401, "unauthorized")):
        fake = fake_server({}, default=default)
        for args in every_command(work):
            r = cli(fake.url, *args)
            assert r.returncode in (1, 2), (args, r.stderr)
            assert_run_inert(r, f"ddpd {' '.join(args)} against HTTP {default[0]}")
            assert b"\\x1b[2J" in r.stderr, (args, r.stderr)
    assert not (work / "m.safetensors").exists()


# ---------------------------------------------------------------------------------------
# a real server


def test_a_real_servers_hostile_names_are_escaped(server, work):
    """A job named with a screen clear and a window title (refused with 422 once the server
    refuses control characters in names: then the refusal is what must be inert), and a
    data file name with ESC in a submission's error."""
    spec = work / "spec.json"
    spec.write_text(json.dumps(seed_spec(name="x" + HOSTILE)))
    r = cli(server.url, "submit", str(spec), token=server.token)
    assert_run_inert(r, "ddpd submit (hostile name)")
    if r.returncode == 0:
        jid = int(r.stdout)
        server.wait_state(jid, ("succeeded", "failed", "cancelled"))
        for args in (["jobs"], ["show", str(jid)], ["watch", str(jid)], ["logs", str(jid)]):
            r = cli(server.url, *args, token=server.token)
            assert r.returncode == 0, (args, r.stderr)
            assert_run_inert(r, "ddpd " + " ".join(args), stdout_keep="\n\t" if args[0] == "logs" else "\n")
        r = cli(server.url, "jobs", token=server.token)
        assert " x\\x1b[2J\\x1b]0;pwned... " in r.stdout.decode(), r.stdout  # cut to its column
        r = cli(server.url, "show", str(jid), token=server.token)
        assert json.loads(r.stdout)["name"] == "x" + HOSTILE
    else:
        assert r.returncode == 2 and b"422" in r.stderr, r.stderr

    bad = seed_spec(data={"type": "npy", "x": "x" + HOSTILE + ".npy", "y": "y.npy"})
    spec.write_text(json.dumps(bad))
    r = cli(server.url, "submit", str(spec), token=server.token)
    assert r.returncode == 2 and b"422" in r.stderr, r.stderr
    assert_run_inert(r, "ddpd submit (hostile data file)")
    # The server refuses the control character itself now (naming the field, not echoing
    # it); a server that echoed the name would have it escaped.
    assert b"data.x: control character U+001B" in r.stderr or b"x\\x1b[2J" in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------
# pull


def model_bytes():
    return st_encode({"0.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
                      "0.bias": np.ones(3, dtype=np.float32)}, {"step": "5"})


def pull(fake, work, *extra, name="m.safetensors"):
    r = cli(fake.url, "pull", "1", "-o", str(work / "dl" / name), *extra)
    assert_run_inert(r, "ddpd pull")
    return r, r.stderr.decode()


@pytest.fixture
def dl(work):
    (work / "dl").mkdir()
    return work / "dl"


def left(dl):
    return sorted(p.name for p in dl.iterdir())


def zeros_for_ever(w):
    """Zeros without end, bounded here so that a client that never stops cannot hold the
    test: 64 MiB, then the connection closes."""
    chunk = bytes(1 << 16)
    for _ in range(1024):
        w.write(chunk)


def test_pull_refuses_an_endless_body_at_max_bytes(fake_server, work, dl):
    fake = fake_server({("GET", "/v1/jobs/1/checkpoint"):
                        (200, {"Content-Type": "application/octet-stream", "Content-Length": None}, zeros_for_ever)})
    r, err = pull(fake, work, "--max-bytes", "1M")
    assert r.returncode == 1, err
    assert "refused after" in err and "more than --max-bytes 1048576 came (it gave no Content-Length)" in err, err
    assert "m.safetensors was not written" in err
    assert left(dl) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_pull_stopped_by_a_signal_leaves_no_file(fake_server, work, dl, sig):
    """Ctrl-C (or kill, or a closed terminal) mid-download: the process ends by the signal
    and the half-written FILE.XXXXXX is gone with it."""
    release = threading.Event()

    def half_then_hold(w):
        w.write(bytes(1 << 20))
        w.flush()
        release.wait(60)  # bounded: the test releases it in any case

    fake = fake_server({("GET", "/v1/jobs/1/checkpoint"):
                        (200, {"Content-Type": "application/octet-stream", "Content-Length": str(4 << 20)},
                         half_then_hold)})
    e = dict(os.environ, DDPD_SERVER=fake.url)
    e.pop("DDPD_TOKEN", None)
    p = subprocess.Popen([ddpd(), "pull", "1", "-o", str(dl / "m.safetensors")], env=e,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the first MiB is in the temporary file
            tmp = [q for q in dl.iterdir() if q.name.startswith("m.safetensors.")]
            if tmp and tmp[0].stat().st_size >= 1 << 19:  # stdio holds the rest of the MiB
                break
            assert p.poll() is None, p.communicate()
            time.sleep(0.02)
        else:
            pytest.fail(f"no temporary file grew in {dl}: {left(dl)}")
        p.send_signal(sig)
        p.communicate(timeout=60)
        assert p.returncode == -sig
        assert left(dl) == []
    finally:
        release.set()
        if p.poll() is None:
            p.kill()
            p.communicate()


def test_pull_refuses_a_content_length_past_max_bytes(fake_server, work, dl):
    body = model_bytes()
    fake = fake_server({("GET", "/v1/jobs/1/checkpoint"): (200, {}, body)})
    r, err = pull(fake, work, "--max-bytes", str(len(body) - 1))
    assert r.returncode == 1 and f"announced {len(body)} bytes (Content-Length), more than --max-bytes" in err, err
    assert left(dl) == []
    r, err = pull(fake, work, "--max-bytes", "0")
    assert r.returncode == 2 and "--max-bytes" in err, err
    r, err = pull(fake, work, "--max-bytes", str(len(body)))
    assert r.returncode == 0, err
    assert left(dl) == ["m.safetensors"]


def test_pull_refuses_a_body_shorter_than_its_content_length(fake_server, work, dl):
    body = model_bytes()

    def half(w):
        w.write(body[:len(body) // 2])

    fake = fake_server({("GET", "/v1/jobs/1/checkpoint"): (200, {"Content-Length": str(len(body))}, half)})
    r, err = pull(fake, work)
    assert r.returncode == 1, err
    assert f"broke off after {len(body) // 2} bytes (its Content-Length said {len(body)})" in err, err
    assert left(dl) == []


def test_pull_refuses_more_than_the_checkpoints_list_gives(fake_server, work, dl):
    body = model_bytes()
    fake = fake_server({
        ("GET", "/v1/jobs/1/checkpoints"): js(200, {"checkpoints": [{"step": 5, "time": 1.0, "bytes": 64}]}),
        ("GET", "/v1/jobs/1/checkpoint"): (200, {"Content-Length": None}, lambda w: w.write(body)),
    })
    r, err = pull(fake, work, "--step", "5")
    assert r.returncode == 1, err
    assert "more than the 64 bytes that GET /v1/jobs/1/checkpoints gives for step 5's files came" in err, err
    assert left(dl) == []
    # Another step's size is no limit on this one.
    r, err = pull(fake, work, "--step", "6")
    assert r.returncode == 0, err


@pytest.mark.parametrize("case", ["truncated", "not_json", "past_the_end", "overlap", "gap", "tiny"])
def test_pull_refuses_what_is_not_a_whole_safetensors_file(fake_server, work, dl, case):
    good = model_bytes()
    n = int.from_bytes(good[:8], "little")
    hdr = json.loads(good[8:8 + n])

    def with_header(h):
        raw = json.dumps(h).encode()
        return len(raw).to_bytes(8, "little") + raw + good[8 + n:]

    first = min(hdr[k]["data_offsets"][0] for k in hdr if k != "__metadata__")
    name = next(k for k in hdr if k != "__metadata__" and hdr[k]["data_offsets"][0] == first)
    other = next(k for k in hdr if k not in ("__metadata__", name))
    body, want = {
        "truncated": (good[:-5], "run past the data section"),
        "not_json": (b"\x10\0\0\0\0\0\0\0{not json at al}" + good[8 + n:], "the header is not JSON"),
        "past_the_end": (with_header(dict(hdr, **{name: dict(hdr[name], shape=[250000], data_offsets=[first, first + 10**6])})),
                         "run past the data section"),
        "overlap": (with_header(dict(hdr, **{other: dict(hdr[other], data_offsets=[
            first, first + hdr[other]["data_offsets"][1] - hdr[other]["data_offsets"][0]])})), "overlap"),
        "gap": (with_header(dict(hdr, **{name: dict(hdr[name], data_offsets=[
            first + 4, hdr[name]["data_offsets"][1] + 4])})), "no tensor covers"),
        "tiny": (b"\x01\x02", "fewer than the 8"),
    }[case]
    # With no Content-Length (the connection's close ends it) and with one: neither helps.
    for headers in ({"Content-Length": None}, {}):
        fake = fake_server({("GET", "/v1/jobs/1/checkpoint"):
                            (200, headers, body if headers == {} else (lambda w: w.write(body)))})
        r, err = pull(fake, work)
        assert r.returncode == 1, err
        assert f"the {len(body)} bytes received are not a whole safetensors file" in err and want in err, err
        assert left(dl) == []


def test_pull_writes_a_good_file(fake_server, work, dl):
    body = model_bytes()
    for headers in ({"Content-Length": None}, {}):
        fake = fake_server({("GET", "/v1/jobs/1/checkpoint"):
                            (200, headers, body if headers == {} else (lambda w: w.write(body)))})
        (dl / "m.safetensors").unlink(missing_ok=True)
        r, err = pull(fake, work)
        assert r.returncode == 0, err
        assert f"wrote {dl / 'm.safetensors'} ({len(body)} bytes)" in err, err
        assert left(dl) == ["m.safetensors"]
        assert (dl / "m.safetensors").read_bytes() == body
        st_decode(body)
        umask = os.umask(0)
        os.umask(umask)
        assert stat.S_IMODE((dl / "m.safetensors").stat().st_mode) == 0o666 & ~umask
