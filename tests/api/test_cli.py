"""test_cli.py — `ddpd` as a client (server/client.c) against a real `ddpd serve`: every
command, the exit codes (0 succeeded, 1 failed, 2 spec rejected, 5 cancelled), a token, a
server that is down, NDJSON when stdout is not a terminal, and the progress line on a
pseudo-terminal (also `ddpd run`'s, on stderr). The options of serve and run are parsed
with getopt_long: an unknown option is named as such.

Every client run has a timeout; every wait is bounded (pylib.server.wait_until).
"""
import fcntl
import json
import os
import pty
import select
import socket
import struct
import subprocess
import termios
import threading
import time

import pytest

from pylib.common import bin_dir
from pylib.safetensors import st_decode
from pylib.server import FOREVER_STEPS, HeldWorker, heavy_spec, seed_spec, wait_until

FINAL = ("succeeded", "failed", "cancelled")


def ddpd():
    b = bin_dir()
    if b is None:
        pytest.skip("ddpd is not built (set DDPD_BIN to the build folder)")
    return str(b / "ddpd")


def cli(srv, *args, env=None, timeout=120, token=True, cwd=None, input=None):
    """Runs `ddpd ARGS` against srv (None: no server given); CompletedProcess with text."""
    e = dict(os.environ)
    e.pop("DDPD_TOKEN", None)
    e.pop("DDPD_SERVER", None)
    if srv is not None:
        e["DDPD_SERVER"] = srv.url
        if token and srv.token:
            e["DDPD_TOKEN"] = srv.token
    if env:
        e.update(env)
    return subprocess.run([ddpd(), *args], env=e, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          input=input)


def spec_file(work, spec, name="spec.json"):
    p = work / name
    p.write_text(json.dumps(spec))
    return str(p)


def submit(srv, work, spec):
    r = cli(srv, "submit", spec_file(work, spec))
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip())


def ndjson(text):
    return [json.loads(ln) for ln in text.splitlines() if ln.strip()]


def on_pty(argv, env, timeout=120, stdout_pty=True, cols=None, on_output=None):
    """Runs argv with stdout (or only stderr) on a pseudo-terminal (`cols` wide); (exit
    code, what the terminal got, stdout when that was a pipe). on_output(what the terminal
    got so far) is called after every read, for a test that acts on what it sees."""
    master, slave = pty.openpty()
    if cols:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
    out = subprocess.PIPE if not stdout_pty else slave
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=slave, env=env)
    os.close(slave)
    got = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 0.5)
            if r:
                try:
                    b = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not b:
                    break
                got += b
                if on_output:
                    on_output(got.decode(errors="replace"))
            elif p.poll() is not None:
                break
        piped = p.stdout.read().decode() if p.stdout else ""
        rc = p.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        os.close(master)
        if p.poll() is None:
            p.kill()
            p.wait()
    return rc, got.decode(errors="replace"), piped


def client_env(srv):
    e = dict(os.environ, DDPD_SERVER=srv.url)
    e.pop("DDPD_TOKEN", None)
    if srv.token:
        e["DDPD_TOKEN"] = srv.token
    return e


# ---------------------------------------------------------------------------------------
# submit, watch, exit codes


def test_submit_then_watch_prints_ndjson_and_exits_0(server, work):
    r = cli(server, "submit", spec_file(work, seed_spec()))
    assert r.returncode == 0, r.stderr
    jid = int(r.stdout.strip())  # the id alone on stdout
    w = cli(server, "watch", str(jid))
    assert w.returncode == 0, w.stderr
    evs = ndjson(w.stdout)  # not a terminal: plain NDJSON, every line an event
    assert evs and all(e["job"] == jid for e in evs), evs[:3]
    seqs = [e["seq"] for e in evs]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
    assert evs[-1]["event"] == "state" and evs[-1]["state"] == "succeeded", evs[-1]
    assert any(e["event"] == "loss" for e in evs)
    # The same events as the API's own NDJSON stream.
    assert evs == server.events(jid)


def test_submit_follow_exit_codes(server, work):
    ok = cli(server, "submit", "--follow", spec_file(work, seed_spec()))
    assert ok.returncode == 0, ok.stderr
    evs = ndjson(ok.stdout)
    assert evs[-1]["state"] == "succeeded", evs[-1]
    assert f"job {evs[-1]['job']} submitted" in ok.stderr

    # A loss that overflows fails the job (on_nonfinite "fail"): exit 1 and the reason.
    bad = seed_spec(name="diverges", optimizer={"type": "sgd", "lr": 1e30})
    r = cli(server, "submit", "-f", spec_file(work, bad, "bad.json"))
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr)
    last = ndjson(r.stdout)[-1]
    assert last["event"] == "state" and last["state"] == "failed", last
    assert f"job {last['job']} failed: " in r.stderr and last["error"] in r.stderr, r.stderr


def test_cancel_and_watch_exit_5(server, work):
    jid = submit(server, work, heavy_spec(steps=FOREVER_STEPS, name="forever"))
    e = client_env(server)
    watcher = subprocess.Popen([ddpd(), "watch", str(jid)], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        server.wait_running(jid)
        r = cli(server, "cancel", str(jid))
        assert r.returncode == 0, r.stderr
        assert f"job {jid}" in r.stdout
        out, err = watcher.communicate(timeout=60)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    assert watcher.returncode == 5, (out[-2000:], err)
    assert ndjson(out)[-1]["state"] == "cancelled"
    assert f"job {jid} cancelled" in err
    # Cancelling a finished job: the server's 409 and its message, exit 1.
    again = cli(server, "cancel", str(jid))
    assert again.returncode == 1 and "already finished" in again.stderr and "409" in again.stderr, again.stderr


def test_watch_reconnects_after_the_server_restarts(make_server, work):
    """The stream breaks off with the server (SIGKILL); the same address comes back and
    watch goes on after the last event it got: nothing lost, nothing twice."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = make_server(extra=["--listen", f"127.0.0.1:{port}"])
    jid = submit(srv, work, heavy_spec(steps=FOREVER_STEPS, name="orphaned", log_every=5))
    watcher = subprocess.Popen([ddpd(), "watch", str(jid)], env=client_env(srv), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(watcher.stdout), daemon=True)
    reader.start()
    try:
        wait_until(lambda: sum('"loss"' in ln for ln in lines) >= 20, 60, "20 loss events through watch")
        srv.kill9()
        srv.start()
        assert srv.url.endswith(f":{port}")
        rc = watcher.wait(timeout=90)
        reader.join(timeout=10)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    err = watcher.stderr.read()
    assert rc == 1, err
    evs = ndjson("".join(lines))
    assert [e["seq"] for e in evs] == [e["seq"] for e in srv.events(jid)], "lost or repeated events"
    assert evs[-1]["state"] == "failed" and "server restarted" in err, (evs[-1], err)


class FakeServer:
    """A stand-in for the server on 127.0.0.1: POST /v1/jobs answers each status of
    `answers` in turn ((status, JSON body)); records the bodies it got."""

    def __init__(self, answers):
        import http.server
        fake = self
        self.answers = list(answers)
        self.bodies = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                fake.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
                status, body = fake.answers.pop(0)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.token = None
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_submit_retries_while_the_server_is_busy(work):
    """503 with code busy (every planner is checking other submissions; the server says
    to try again) is retried a few times, further apart each time; another 503 is not."""
    busy = (503, {"error": {"code": "busy", "message": "every data check was busy", "path": ""}})
    fake = FakeServer([busy, busy, (201, {"id": 42, "state": "queued"})])
    try:
        r = cli(fake, "submit", spec_file(work, seed_spec()))
    finally:
        fake.close()
    assert r.returncode == 0 and r.stdout == "42\n", (r.stdout, r.stderr)
    assert r.stderr.count("is busy checking other submissions; trying again") == 2, r.stderr
    assert len(fake.bodies) == 3 and len(set(fake.bodies)) == 1
    assert json.loads(fake.bodies[0]) == seed_spec()

    down = (503, {"error": {"code": "unavailable", "message": "the database is unavailable", "path": ""}})
    fake = FakeServer([down])
    try:
        r = cli(fake, "submit", spec_file(work, seed_spec()))
    finally:
        fake.close()
    assert r.returncode == 1 and "the database is unavailable (HTTP 503 unavailable" in r.stderr, r.stderr
    assert len(fake.bodies) == 1


def test_invalid_spec_exit_2_names_the_path(server, work):
    bad = seed_spec(model=[{"type": "linear", "in": 10, "out": 5}, {"type": "linear", "in": 4, "out": 5}])
    r = cli(server, "submit", spec_file(work, bad))
    assert r.returncode == 2, r.stderr
    assert "model[1].in" in r.stderr and "422" in r.stderr, r.stderr
    r = cli(server, "submit", str(work / "nope.json"))
    assert r.returncode == 2 and "nope.json" in r.stderr, r.stderr
    (work / "broken.json").write_text("{not json")
    r = cli(server, "submit", str(work / "broken.json"))
    assert r.returncode == 2 and "400" in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------
# jobs, show, logs, rm, checkpoints, pull


def test_jobs_show_logs_rm(server, work):
    a = submit(server, work, seed_spec(name="first-job"))
    server.wait_state(a, FINAL)
    b = submit(server, work, seed_spec(name="second-job"))
    server.wait_state(b, FINAL)

    r = cli(server, "jobs")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATE", "STEP", "LOSS", "AGE"], lines[0]
    rows = [ln.split() for ln in lines[1:]]
    assert [row[0] for row in rows] == [str(b), str(a)], rows  # newest first
    assert rows[0][1] == "second-job" and rows[0][2] == "succeeded" and rows[0][3] == "1000/1000", rows[0]
    assert float(rows[0][4]) == pytest.approx(server.job(b)["loss"], rel=1e-3)

    r = cli(server, "jobs", "--limit", "1", "--state", "succeeded")
    assert r.returncode == 0 and [ln.split()[0] for ln in r.stdout.splitlines()[1:2]] == [str(b)], r.stdout
    assert "more" in r.stdout.splitlines()[-1]
    r = cli(server, "jobs", "--state", "bogus")
    assert r.returncode == 1 and "unknown state" in r.stderr and "state" in r.stderr, r.stderr
    r = cli(server, "jobs", "--limit", "0")
    assert r.returncode == 2 and "--limit" in r.stderr, r.stderr

    r = cli(server, "show", str(a))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("{\n  \"id\"")  # pretty
    assert json.loads(r.stdout) == server.job(a)

    r = cli(server, "logs", str(a))
    assert r.returncode == 0 and "done:" in r.stdout, r.stdout[-1000:]
    r = cli(server, "logs", "--rank", "1", str(a))
    assert r.returncode == 1 and "rank" in r.stderr, r.stderr

    r = cli(server, "rm", str(a))
    assert r.returncode == 0 and f"job {a} deleted" in r.stdout, r.stderr
    r = cli(server, "show", str(a))
    assert r.returncode == 1 and f"job {a} not found" in r.stderr and "404" in r.stderr, r.stderr


def test_logs_follow_until_the_job_ends(make_server, work):
    # The rank has written its whole log ("done:") but the job runs until the test lets
    # it end: `logs -f` prints the log and then waits for the end.
    held = HeldWorker(work)
    server = make_server(cpu_slots=2, env=held.env)
    jid = submit(server, work, heavy_spec(steps=2000))
    server.wait_running(jid)
    p = subprocess.Popen([ddpd(), "logs", "-f", str(jid)], env=client_env(server), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True)
        reader.start()
        wait_until(lambda: any("done:" in ln for ln in lines), 60, "`logs -f` to print the rank's last line")
        assert p.poll() is None and server.job(jid)["state"] == "running", "`logs -f` ended before the job"
        held.release()
        rc = p.wait(timeout=120)
        reader.join(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert rc == 0, p.stderr.read()
    assert server.job(jid)["state"] == "succeeded"
    # Nothing printed twice: the whole log, once.
    full = cli(server, "logs", "--tail", "100000", str(jid)).stdout
    assert "".join(lines) == full


def test_pull_writes_the_model_atomically(server, work):
    jid = submit(server, work, seed_spec())
    server.wait_state(jid, "succeeded")
    want = server.get(f"/v1/jobs/{jid}/checkpoint").content
    out = work / "out" / "model.safetensors"
    out.parent.mkdir()
    r = cli(server, "pull", str(jid), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == want and str(out) in r.stderr
    assert "0.weight" in st_decode(out.read_bytes())[0]
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.safetensors"]  # no temporary left
    # The default name, in the current folder.
    r = cli(server, "pull", str(jid), cwd=str(out.parent))
    assert r.returncode == 0 and (out.parent / f"job-{jid}.safetensors").read_bytes() == want, r.stderr
    # An error leaves nothing behind, not even the temporary file.
    r = cli(server, "pull", "999", "-o", str(out.parent / "missing.safetensors"))
    assert r.returncode == 1 and "999" in r.stderr and "404" in r.stderr, r.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["job-%d.safetensors" % jid, "model.safetensors"]


def test_checkpoints_and_pull_a_step(server, work):
    """Needs GET /v1/jobs/{id}/checkpoints and ?step= (issue 19 part 3): fails without."""
    spec = seed_spec(name="ckpts", checkpoint={"every_steps": 250, "keep_last": 10},
                     optimizer={"type": "sgd", "lr": 0.01, "momentum": 0.9})
    jid = submit(server, work, spec)
    server.wait_state(jid, "succeeded")
    r = cli(server, "checkpoints", str(jid))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["STEP", "TIME", "BYTES", "KIND"], lines
    steps = [int(ln.split()[0]) for ln in lines[1:]]
    # Oldest first, then the final model (issue 31), marked so.
    assert steps == [250, 500, 750, 1000] and lines[-1].split()[-1] == "final", r.stdout
    assert all(int(ln.split()[3]) > 0 for ln in lines[1:])
    out = work / "s500.safetensors"
    r = cli(server, "pull", str(jid), "--step", "500", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == server.get(f"/v1/jobs/{jid}/checkpoint", params={"step": 500}).content
    assert st_decode(out.read_bytes())[1]["step"] == "500"
    # The optimizer state of that step.
    r = cli(server, "pull", str(jid), "--step", "500", "--optim", cwd=str(work))
    assert r.returncode == 0, r.stderr
    optim = (work / f"job-{jid}-step-500-optim.safetensors").read_bytes()
    assert optim == server.get(f"/v1/jobs/{jid}/checkpoint", params={"step": 500, "file": "optim"}).content
    assert optim != out.read_bytes()
    r = cli(server, "pull", str(jid), "--step", "7", "-o", str(work / "s7.safetensors"))
    assert r.returncode == 1 and "250" in r.stderr and "404" in r.stderr, r.stderr
    assert not (work / "s7.safetensors").exists()


# ---------------------------------------------------------------------------------------
# token, a server that is down, options


def test_token(make_server, work):
    srv = make_server(token="s3cret-token")
    r = cli(srv, "jobs", token=False)
    assert r.returncode == 1 and "401" in r.stderr and "DDPD_TOKEN" in r.stderr, r.stderr
    r = cli(srv, "jobs", token=False, env={"DDPD_TOKEN": "wrong-token"})
    assert r.returncode == 1 and "401" in r.stderr and "token" in r.stderr, r.stderr
    r = cli(srv, "jobs", token=False, env={"DDPD_TOKEN": "two words"})
    assert r.returncode == 2 and "DDPD_TOKEN" in r.stderr and "whitespace" in r.stderr, r.stderr
    r = cli(srv, "jobs", "--token-file", str(srv.token_file), token=False)
    assert r.returncode == 0, r.stderr
    r = cli(srv, "jobs", "--token-file", str(work / "missing"), token=False)
    assert r.returncode == 2 and "--token-file" in r.stderr and "missing" in r.stderr, r.stderr
    jid = submit(srv, work, seed_spec())  # DDPD_TOKEN
    w = cli(srv, "watch", str(jid))
    assert w.returncode == 0 and ndjson(w.stdout)[-1]["state"] == "succeeded", w.stderr


def test_server_down(work):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for args in (["jobs"], ["show", "1"], ["watch", "1"], ["submit", str(work / "x.json")], ["pull", "1"]):
        (work / "x.json").write_text(json.dumps(seed_spec()))
        r = cli(None, *args, env={"DDPD_SERVER": f"127.0.0.1:{port}"}, cwd=str(work))
        assert r.returncode == 1, (args, r.stderr)
        assert f"cannot reach the server at http://127.0.0.1:{port}" in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = cli(None, "jobs", "--server", f"http://127.0.0.1:{port}/")
    assert r.returncode == 1 and f"http://127.0.0.1:{port}:" in r.stderr, r.stderr
    r = cli(None, "jobs", env={"DDPD_SERVER": "ftp://127.0.0.1"})
    assert r.returncode == 2 and "DDPD_SERVER ftp://127.0.0.1: expected an http:// or https://" in r.stderr, r.stderr


def test_options_are_named():
    b = ddpd()
    r = subprocess.run([b, "serve", "--bogus"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "unknown option '--bogus'" in r.stderr, r.stderr
    r = subprocess.run([b, "serve", "--listen"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "'--listen' needs a value" in r.stderr, r.stderr
    r = subprocess.run([b, "serve", "--s", "x"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "'--s' is ambiguous: --slurm-partition" in r.stderr, r.stderr
    r = subprocess.run([b, "serve", "--insecure=yes"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "'--insecure' takes no value" in r.stderr, r.stderr
    r = subprocess.run([b, "run", "--frob", "x.json"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "unknown option '--frob'" in r.stderr, r.stderr
    r = subprocess.run([b, "frobnicate"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "unknown command 'frobnicate'" in r.stderr, r.stderr
    for c in ("serve", "run", "submit", "jobs", "show", "watch", "logs", "cancel", "rm", "checkpoints", "pull"):
        assert f"ddpd {c}" in r.stderr, (c, r.stderr)
        h = subprocess.run([b, c, "--help"], capture_output=True, text=True, timeout=30)
        assert h.returncode == 0 and h.stdout.startswith(f"usage: ddpd {c}"), (c, h.stdout, h.stderr)
    for args, what in ((["jobs", "--bogus"], "unknown option '--bogus'"), (["logs", "-x", "1"], "unknown option '-x'"),
                       (["pull", "1", "--step"], "'--step' needs a value"), (["show"], "missing ID"),
                       (["show", "abc"], "expected a job id"), (["logs", "--rank", "-1", "1"], "--rank"),
                       (["show", "1", "2"], "expected only ID"), (["logs", "--t", "2", "1"], "is ambiguous"),
                       (["pull", "--output"], "'--output' needs a value")):
        r = subprocess.run([b, *args], capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, DDPD_SERVER="127.0.0.1:9"))
        assert r.returncode == 2 and what in r.stderr, (args, r.stderr)


# ---------------------------------------------------------------------------------------
# the progress line on a terminal


def test_watch_on_a_terminal_draws_one_line(server, work):
    jid = submit(server, work, seed_spec(name="tty"))
    server.wait_state(jid, "succeeded")
    rc, got, _ = on_pty([ddpd(), "watch", str(jid)], client_env(server))
    assert rc == 0, got
    assert "{" not in got, got  # no NDJSON on a terminal
    assert "\r" in got and got.endswith("\r\n"), repr(got)
    final = got.replace("\r\n", "\n").split("\r")[-1].strip()
    assert final.startswith(f"job {jid} succeeded") and "step 1000/1000 (100%)" in final, repr(final)
    assert "loss " in final, final

    # Live: a running job shows its step, samples/s and ETA; it runs until the test has
    # seen such a line and cancels it.
    def live_line(f):
        return " running " in f and "samples/s" in f and "ETA" in f

    def cancel_once_seen(text):
        frames = [f.strip() for f in text.replace("\r\n", "\r").split("\r")]
        if not cancelled and any(live_line(f) for f in frames):
            live = next(j["id"] for j in server.get("/v1/jobs").json()["jobs"] if j["name"] == "forever-tty")
            assert server.post(f"/v1/jobs/{live}/cancel").status_code == 202
            cancelled.append(live)

    cancelled = []
    rc, got, _ = on_pty([ddpd(), "submit", "--follow", spec_file(work, heavy_spec(steps=FOREVER_STEPS, name="forever-tty", log_every=100))],
                        client_env(server), on_output=cancel_once_seen)
    assert cancelled, got[-2000:]
    assert rc == 5, got[-2000:]  # cancelled
    frames = [f.strip() for f in got.replace("\r\n", "\r").split("\r") if f.strip()]
    assert any(live_line(f) for f in frames), frames[:20]
    # The final line, then the outcome on stderr (the same terminal).
    assert frames[-2].startswith(f"job {cancelled[0]} cancelled  step"), frames[-2:]
    assert frames[-1] == f"ddpd submit: job {cancelled[0]} cancelled: cancelled", frames[-2:]

    # A narrow terminal: the line is cut to its width, never wrapped.
    rc, got, _ = on_pty([ddpd(), "watch", str(jid)], client_env(server), cols=30)
    assert rc == 0, got
    frames = [f for f in got.replace("\r\n", "\r").split("\r") if f.strip()]
    assert frames and all(len(f) <= 29 for f in frames), frames
    assert frames[-1].startswith(f"job {jid} succeeded  step"), frames


def test_run_shows_progress_on_a_terminal(work):
    spec = spec_file(work, seed_spec())
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rc, got, piped = on_pty([ddpd(), "run", "--out", str(work / "out"), spec], env, stdout_pty=False)
    assert rc == 0, got
    evs = ndjson(piped)  # stdout stays the events
    assert evs[-1]["event"] == "done", evs[-1]
    final = got.replace("\r\n", "\n").split("\r")[-1]
    assert "succeeded  step 1000/1000 (100%)" in final, repr(got[-500:])
    # stdout a terminal too: the events show there, no line is drawn between them.
    rc, got, _ = on_pty([ddpd(), "run", "--out", str(work / "out1"), spec], env)
    assert rc == 0 and "succeeded  step" not in got and '"event":"done"' in got, got[-500:]
    # Not a terminal: no progress line at all.
    r = subprocess.run([ddpd(), "run", "--out", str(work / "out2"), spec], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0 and "\r" not in r.stderr, r.stderr
