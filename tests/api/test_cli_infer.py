"""test_cli_infer.py — `ddpd generate`, `ddpd predict` and `ddpd pull --pytorch`
(server/client_infer.c, client_pull.c) against a fake server on 127.0.0.1 that speaks the
REST answers of issue 29's design (§2): POST /v1/jobs/{id}/generate streaming NDJSON (one
line per token, then the final object with "done": true), POST /v1/jobs/{id}/predict taking
an .npy body, and errors in the API's one error body. The real routes come with the server's
inference pool; these tests check what the client does with whatever arrives:

- generate prints each token's text as it comes, through termsafe (newlines and tabs
  kept, every other control character, DEL and C1 escaped: a model cannot drive the
  terminal), whole characters when a UTF-8 sequence is split between two writes, ids when
  the tokens carry no text, a final newline; the request is the JSON the design names;
- an error answer (422 naming the field, 409, 404, 503 with Retry-After) prints the
  server's message, escaped, and exits non-zero (2 for a request the server refused as
  invalid); an error line mid-stream and a stream cut before its final line exit 1;
- Ctrl-C (SIGINT) ends the request: the server sees the connection close, the terminal
  gets its newline, exit 130;
- predict uploads the .npy bytes as they are (application/x-npy; the step in the query),
  prints the table of top classes or the raw outputs, or the answer's JSON with --json
  (the same JSON value, escaped); a file that is not .npy is refused before any request;
- pull --pytorch writes DIR/model.py and DIR/model.safetensors, and fetches model.py first:
  a server without the route costs no download.

Every client run has a timeout; every wait is bounded."""
import http.server
import json
import os
import queue
import signal
import socketserver
import subprocess
import threading
import time

import numpy as np
import pytest

from pylib.common import bin_dir
from pylib.safetensors import st_encode

ESC = "\x1b[2J\x1b]0;pwned\x07\x1b[31m\u009b32m\x7f\x08\r"


def ddpd():
    b = bin_dir()
    if b is None:
        pytest.skip("ddpd is not built (set DDPD_BIN to the build folder)")
    return str(b / "ddpd")


def cli(url, *args, timeout=60, stdin=None, cwd=None):
    e = dict(os.environ, DDPD_SERVER=url)
    e.pop("DDPD_TOKEN", None)
    return subprocess.run([ddpd(), *args], env=e, capture_output=True, timeout=timeout, cwd=cwd,
                          input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL)


def assert_inert(data, what, keep="\n"):
    """data (bytes) is UTF-8 with no C0 control but `keep`, no DEL, no C1 control."""
    text = data.decode("utf-8")
    bad = sorted({hex(ord(ch)) for ch in text if (ord(ch) < 0x20 and ch not in keep) or 0x7F <= ord(ch) <= 0x9F})
    assert not bad, f"{what}: raw control characters {bad} reach the terminal: {data[:400]!r}"


def error_body(code, message, path=""):
    return json.dumps({"error": {"code": code, "message": message, "path": path}}).encode()


class Fake:
    """An HTTP/1.0 server on 127.0.0.1 (its own thread) that records each request
    (method, path with query, headers, body) and answers with routes[(method, path)]: a
    function (handler) -> None that writes the whole answer with handler.send_*. A
    disconnect seen while writing sets `disconnected`."""

    def __init__(self, routes):
        fake = self
        self.routes = routes
        self.requests = []
        self.disconnected = threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def answer(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                fake.requests.append({"method": self.command, "path": self.path, "headers": dict(self.headers),
                                      "body": body})
                route = fake.routes.get((self.command, self.path.split("?", 1)[0]))
                try:
                    if route is None:
                        self.reply(404, error_body("not_found", f"no such resource: {self.path}"))
                    else:
                        route(self)
                except (BrokenPipeError, ConnectionResetError):
                    fake.disconnected.set()

            def reply(self, status, body, ctype="application/json", headers=()):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in headers:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def start_stream(self):
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.end_headers()
                self.wfile.flush()

            def chunk(self, data):
                self.wfile.write(data)
                self.wfile.flush()

            do_GET = do_POST = answer

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
def fake():
    made = []

    def make(routes):
        f = Fake(routes)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()


def line(obj):
    return (json.dumps(obj) + "\n").encode()


FINAL = {"done": True, "prompt_tokens": 3, "cropped": 0, "seed": 1234, "step": 40, "model": "final",
         "cancelled": False, "seconds": 0.25}


def stream_of(events):
    """A generate route that streams `events` (dicts or raw bytes), each with one write."""
    def route(h):
        h.start_stream()
        for ev in events:
            h.chunk(ev if isinstance(ev, bytes) else line(ev))
    return route


# ---- generate -----------------------------------------------------------------------------


def test_generate_streams_text_escaped(fake):
    """Tokens whose text holds escape sequences, a newline and a tab, and 'é' / '中' whose
    JSON lines are split mid-character between writes: stdout shows every token's text,
    escaped, with newline and tab kept and the characters whole, then a final newline."""
    raw = '{"token": 5, "text": "é中"}\n'.encode()  # UTF-8 as it is in the JSON line
    in_e, in_zh = raw.index("é".encode()) + 1, raw.index("中".encode()) + 2
    events = [{"token": 1, "text": "Hi"}, {"token": 2, "text": ESC}, {"token": 3, "text": "\n\tok"},
              {"token": 4, "text": ""}, raw[:in_e], raw[in_e:], raw[:in_zh], raw[in_zh:],
              dict(FINAL, ids=[1, 2, 3, 4, 5, 5], text="...")]
    f = fake({("POST", "/v1/jobs/7/generate"): stream_of(events)})
    r = cli(f.url, "generate", "-n", "6", "--temperature", "0.5", "--top-k", "3", "--seed", "1234", "--step", "40",
            "7", "Say \x1b hi")
    assert r.returncode == 0, r.stderr
    assert_inert(r.stdout, "stdout", keep="\n\t")
    assert_inert(r.stderr, "stderr")
    out = r.stdout.decode()
    assert out == "Hi\\x1b[2J\\x1b]0;pwned\\x07\\x1b[31m\\u009b32m\\x7f\\x08\\r\n\toké中é中\n", out
    assert "6 tokens from job 7's final model" in r.stderr.decode() and "seed 1234" in r.stderr.decode()
    req = f.requests[0]
    assert req["headers"]["Content-Type"] == "application/json"
    assert req["headers"]["Accept"] == "application/x-ndjson"
    assert json.loads(req["body"]) == {"prompt": "Say \x1b hi", "max_new_tokens": 6, "temperature": 0.5, "top_k": 3,
                                       "seed": 1234, "step": 40, "stream": True}


def test_generate_ids_and_prompt_from_stdin(fake):
    """--ids for a vocabulary that is not bytes: the tokens come without text and print as
    ids; a prompt of '-' is read from stdin; a cropped prompt is said on stderr."""
    f = fake({("POST", "/v1/jobs/3/generate"): stream_of(
        [{"token": 11}, {"token": 12}, {"token": 13}, dict(FINAL, ids=[11, 12, 13], cropped=2)])})
    r = cli(f.url, "generate", "--ids", "1,2,3", "3")
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"11 12 13\n"
    assert json.loads(f.requests[0]["body"]) == {"ids": [1, 2, 3], "stream": True}
    assert "first 2 tokens were dropped" in r.stderr.decode()
    r = cli(f.url, "generate", "3", "-", stdin="line one\nline two é\n".encode())
    assert r.returncode == 0, r.stderr
    assert json.loads(f.requests[1]["body"])["prompt"] == "line one\nline two é\n"


def test_generate_answer_without_stream(fake):
    """A server that answers with one JSON object (no token lines): its text is printed."""
    f = fake({("POST", "/v1/jobs/3/generate"): lambda h: h.reply(
        200, json.dumps(dict(FINAL, ids=[104, 105], text="hi\x1b")).encode())})
    r = cli(f.url, "generate", "3", "x")
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"hi\\x1b\n"


@pytest.mark.parametrize("status,code,path,message,rc", [
    (422, "invalid_spec", "ids[3]", "id 999 is outside the vocabulary [0, 256) " + ESC, 2),
    (422, "invalid_spec", "model", "generate needs a model that starts with embedding and ends in logits over "
                                   "the vocabulary; job 3's ends in linear", 2),
    (409, "no_model", "", "job 3 has no model yet (no checkpoint and no final model)", 1),
    (404, "not_found", "", "job 3 not found", 1),
    (413, "too_large", "", "the body is over 1 MiB", 2),
])
def test_generate_error_answers(fake, status, code, path, message, rc):
    f = fake({("POST", "/v1/jobs/3/generate"): lambda h: h.reply(status, error_body(code, message, path))})
    r = cli(f.url, "generate", "3", "hello")
    assert r.returncode == rc, r.stderr
    assert r.stdout == b""
    assert_inert(r.stderr, "stderr")
    err = r.stderr.decode()
    assert f"HTTP {status} {code}" in err and (path + ": " if path else "") in err, err
    assert message.split(" " + ESC[0])[0][:40] in err, err


def test_generate_busy_says_when_to_retry(fake):
    f = fake({("POST", "/v1/jobs/3/generate"): lambda h: h.reply(
        503, error_body("busy", "the inference queue is full (8 waiting)"), headers=[("Retry-After", "2")])})
    r = cli(f.url, "generate", "3", "hello")
    assert r.returncode == 1
    err = r.stderr.decode()
    assert "the inference queue is full" in err and "try again in 2 s" in err, err


def test_generate_error_mid_stream_and_cut_stream(fake):
    f = fake({("POST", "/v1/jobs/3/generate"): stream_of(
        [{"token": 1, "text": "a"}, {"error": {"code": "inference_failed", "path": "",
                                              "message": "the inference process died (signal 9)\x1b[2J"}}]),
              ("POST", "/v1/jobs/4/generate"): stream_of([{"token": 1, "text": "a"}, {"token": 2, "text": "b"}])})
    r = cli(f.url, "generate", "3", "x")
    assert r.returncode == 1 and r.stdout == b"a\n"
    assert_inert(r.stderr, "stderr")
    assert "failed after 1 tokens: the inference process died (signal 9)\\x1b[2J" in r.stderr.decode()
    r = cli(f.url, "generate", "4", "x")
    assert r.returncode == 1 and r.stdout == b"ab\n"
    assert "ended before the generation did, after 2 tokens" in r.stderr.decode()


def test_generate_usage_errors_make_no_request(fake):
    f = fake({})
    for args, words in [(["3"], "missing the PROMPT"), (["--ids", "1,2", "3", "p"], "not both"),
                        (["--ids", "1,x", "3"], "item 2 is 'x'"), (["--temperature", "-1", "3", "p"], "--temperature"),
                        (["-n", "0", "3", "p"], "-n: expected an integer from 1"), (["x", "p"], "job id")]:
        r = cli(f.url, "generate", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert words in r.stderr.decode(), (args, r.stderr)
    # A prompt that is not UTF-8 is said so (the argv as bytes).
    r = subprocess.run([ddpd(), "generate", "3", b"\xff\xfe"], env=dict(os.environ, DDPD_SERVER=f.url),
                       capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and b"not UTF-8" in r.stderr, r.stderr
    assert f.requests == []


def test_ctrl_c_ends_the_request(fake):
    """SIGINT mid-stream: the client closes the connection (the fake server's next writes
    fail), prints its final newline and exits 130."""
    stop = threading.Event()

    def endless(h):
        h.start_stream()
        for i in range(100000):  # bounded: the client goes long before
            if stop.is_set():
                return
            h.chunk(line({"token": 1, "text": "x"}))
            time.sleep(0.01)  # a model's pace; not a synchronisation

    f = fake({("POST", "/v1/jobs/3/generate"): endless})
    e = dict(os.environ, DDPD_SERVER=f.url)
    p = subprocess.Popen([ddpd(), "generate", "3", "hi"], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL)
    got = queue.Queue()
    threading.Thread(target=lambda: got.put(p.stdout.read(1)), daemon=True).start()
    try:
        assert got.get(timeout=30) == b"x", "no token reached stdout"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        # The fake server keeps writing a token every 10 ms until a write fails.
        assert f.disconnected.wait(30), "the server never saw the connection close"
    finally:
        stop.set()
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, err
    assert out.endswith(b"\n") and set(out.strip()) <= {ord("x")}, out[-50:]
    assert b"interrupted after" in err, err


# ---- predict ------------------------------------------------------------------------------


def npy_bytes(a, tmp):
    p = tmp / "x.npy"
    np.save(p, a)
    return p, p.read_bytes()


def test_predict_uploads_the_npy_and_prints_the_table(fake, tmp_path):
    p, raw = npy_bytes(np.arange(2 * 64, dtype=np.float32).reshape(2, 1, 8, 8), tmp_path)
    top = [[{"class": 7, "p": 0.9731}, {"class": 1, "p": 0.012}, {"class": 9, "p": 0.0051},
            {"class": 4, "p": 0.0032}, {"class": 3, "p": 0.0019}],
           [{"class": 0, "p": 0.5}, {"class": 6, "p": 0.25}]]
    ans = {"outputs": [[0.1] * 10, [0.2] * 10], "shape": [10], "top": top, "step": 40, "model": "ckpt-40"}
    f = fake({("POST", "/v1/jobs/5/predict"): lambda h: h.reply(200, json.dumps(ans).encode())})
    r = cli(f.url, "predict", "--step", "40", "5", str(p))
    assert r.returncode == 0, r.stderr
    req = f.requests[0]
    assert req["path"] == "/v1/jobs/5/predict?step=40"
    assert req["headers"]["Content-Type"] == "application/x-npy"
    assert req["body"] == raw
    rows = r.stdout.decode().splitlines()
    assert rows[0].split()[:3] == ["SAMPLE", "CLASS", "P"], rows
    assert rows[1].split()[:3] == ["0", "7", "0.9731"] and "1 0.0120, 9 0.0051, 4 0.0032, 3 0.0019" in rows[1], rows
    assert rows[2].split()[:3] == ["1", "0", "0.5000"] and "6 0.2500" in rows[2], rows
    assert "2 samples through job 5's checkpoint ckpt-40" in r.stderr.decode()
    # stdin, and no step
    r = cli(f.url, "predict", "5", "-", stdin=raw)
    assert r.returncode == 0, r.stderr
    assert f.requests[1]["path"] == "/v1/jobs/5/predict" and f.requests[1]["body"] == raw


def test_predict_raw_outputs_and_json(fake, tmp_path):
    p, raw = npy_bytes(np.zeros((2, 3), np.float32), tmp_path)
    ans = {"outputs": [[[1.5, -2.0], [3.25, 4.0]], [list(range(12))]], "shape": [2, 2], "step": 3,
           "model": "final\x1b[2J"}
    body = json.dumps(ans).encode()
    f = fake({("POST", "/v1/jobs/5/predict"): lambda h: h.reply(200, body)})
    r = cli(f.url, "predict", "5", str(p))
    assert r.returncode == 0, r.stderr
    assert_inert(r.stderr, "stderr")
    rows = r.stdout.decode().splitlines()
    assert rows[0].split() == ["SAMPLE", "OUTPUTS", "[2,2]"], rows
    assert rows[1].split() == ["0", "1.5", "-2", "3.25", "4"], rows
    assert rows[2].startswith("1 ") and "... (12 values; --json prints them all)" in rows[2], rows
    r = cli(f.url, "predict", "--json", "5", str(p))
    assert r.returncode == 0, r.stderr
    assert_inert(r.stdout, "stdout")
    assert json.loads(r.stdout) == ans


def test_predict_errors(fake, tmp_path):
    p, _ = npy_bytes(np.zeros((2, 3), np.float32), tmp_path)
    f = fake({("POST", "/v1/jobs/5/predict"): lambda h: h.reply(
        422, error_body("invalid_spec", "expected a sample of shape [10], got [3]" + ESC, "inputs[0]")),
              ("POST", "/v1/jobs/6/predict"): lambda h: h.reply(
        413, error_body("too_large", "the upload is over --infer-max-bytes (64 MiB)"))})
    r = cli(f.url, "predict", "5", str(p))
    assert r.returncode == 2, r.stderr
    assert_inert(r.stderr, "stderr")
    assert "inputs[0]: expected a sample of shape [10], got [3]\\x1b[2J" in r.stderr.decode()
    r = cli(f.url, "predict", "6", str(p))
    assert r.returncode == 2 and "--infer-max-bytes" in r.stderr.decode()
    n = len(f.requests)
    text = tmp_path / "x.txt"
    text.write_text("1,2,3\n")
    for args, words in [([str(text)], "is not a .npy file"), ([str(tmp_path / "none.npy")], "No such file"),
                        ([], "missing ID and FILE.npy")]:
        r = cli(f.url, "predict", "5", *args)
        assert r.returncode == 2 and words in r.stderr.decode(), r.stderr
    assert len(f.requests) == n, "a refused file made a request"


# ---- pull --pytorch -----------------------------------------------------------------------


def test_pull_pytorch_writes_both_files(fake, tmp_path):
    weights = st_encode({"0.weight": np.ones((5, 10), np.float32), "0.bias": np.zeros(5, np.float32)})
    model_py = b'"""model.py: job 5"""\nJOB = 5\n'
    f = fake({("GET", "/v1/jobs/5/pytorch"): lambda h: h.reply(200, model_py, ctype="text/x-python"),
              ("GET", "/v1/jobs/5/checkpoint"): lambda h: h.reply(200, weights, ctype="application/octet-stream"),
              ("GET", "/v1/jobs/5/checkpoints"): lambda h: h.reply(200, b'{"checkpoints": []}')})
    r = cli(f.url, "pull", "--pytorch", "--step", "40", "5", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "model.py").read_bytes() == model_py
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == weights
    assert sorted(os.listdir(tmp_path / "out")) == ["model.py", "model.safetensors"]
    assert [q["path"] for q in f.requests] == ["/v1/jobs/5/checkpoints", "/v1/jobs/5/pytorch",
                                                "/v1/jobs/5/checkpoint?step=40"]
    # A server without the route: nothing downloaded, nothing written.
    r = cli(f.url, "pull", "--pytorch", "6", "out6", cwd=tmp_path)
    assert r.returncode == 1 and "no such resource" in r.stderr.decode(), r.stderr
    assert not (tmp_path / "out6").exists()
    assert not any(q["path"].startswith("/v1/jobs/6/checkpoint") for q in f.requests)
    for args, words in [(["--pytorch", "5"], "missing ID and DIR"), (["--pytorch", "-o", "x", "5", "d"], "no -o"),
                        (["--pytorch", "--optim", "5", "d"], "no --optim")]:
        r = cli(f.url, "pull", *args, cwd=tmp_path)
        assert r.returncode == 2 and words in r.stderr.decode(), (args, r.stderr)
