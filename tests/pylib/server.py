"""server.py — helpers of the suites that talk to a real server (tests/api, tests/faults,
tests/slurm): the real `ddpd serve` on an ephemeral 127.0.0.1 port with a fresh database,
talked to over HTTP (requests, and the real `curl` binary for streams); /proc helpers;
bounded waits; job specs. The fixtures (work, make_server, server, curl_streams) are
declared by each suite's conftest.py, which imports them from here.

Run with the interpreter that has pytest, requests, numpy and torch:
`DDPD_BIN=build /usr/bin/python3 -m pytest -q tests/api`.
Environment: DDPD_BIN and DDPD_TEST_TMP as in pylib.common; a test's folder (database,
job files, the server's stderr) is removed when the test passed and kept when it failed,
or always with DDPD_KEEP_TMP=1. When every test was skipped (no binaries) pytest exits
with 77, ctest's skip code.

Every wait here is bounded; every server is stopped at teardown, and teardown fails the
test when a worker process that server started is still alive afterwards.
"""
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from pylib.common import REPO, bin_dir, folder_for_test, install_skip_code, tmp_root  # noqa: F401
from pylib.safetensors import st_decode  # noqa: F401

SEED_SPEC = REPO / "examples" / "seed.json"

# ---------------------------------------------------------------------------------------
# a test's folder


@pytest.fixture
def work(request):
    """A fresh folder for one test: removed after a pass, kept after a failure."""
    yield from folder_for_test(request, "api-")


def binary_has_faultvfs():
    """True when ddpd was built with -DDDPD_FAULT_INJECTION=ON (tests/faults/faultvfs.c)."""
    b = bin_dir()
    return b is not None and b"DDPD_FAULT_SQLITE" in (b / "ddpd").read_bytes()


# ---------------------------------------------------------------------------------------
# processes (/proc)


def proc_stat(pid):
    """(state, ppid, start time in ticks, comm) of a process, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return None
    lp, rp = raw.index("("), raw.rindex(")")
    comm = raw[lp + 1:rp]
    f = raw[rp + 2:].split()
    return f[0], int(f[1]), int(f[19]), comm


def alive(pid, start_time=None):
    """True while `pid` runs (not a zombie) and, when given, started at `start_time`."""
    st = proc_stat(pid)
    if st is None or st[0] in ("Z", "X"):
        return False
    return start_time is None or st[2] == start_time


def children(pid):
    """[(pid, comm)] of the live direct children of `pid`."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        st = proc_stat(int(p))
        if st and st[1] == pid and st[0] not in ("Z", "X"):
            out.append((int(p), st[3]))
    return out


def wait_until(fn, timeout, what, interval=0.05):
    """Polls fn() until it returns something truthy; that value, or AssertionError after
    `timeout` seconds naming `what` (and the last value)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}"[:3000])
        time.sleep(interval)


# ---------------------------------------------------------------------------------------
# the server


class Server:
    """One `ddpd serve` on 127.0.0.1:<ephemeral> with the database in `root`/db."""

    PORT_RE = re.compile(r"\(port (\d+)\)")

    def __init__(self, root, cpu_slots=2, token=None, data_dir=None, extra=(), env=None):
        b = bin_dir()
        if b is None:
            pytest.skip("ddpd is not built (set DDPD_BIN to the build folder)")
        self.bin = b
        self.root = Path(root)
        self.db = self.root / "db" / "ddpd.db"
        self.jobs_dir = self.db.parent / "jobs"
        self.data_dir = Path(data_dir) if data_dir else self.root / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.db.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # ddpd serve makes no folder for a --db
        self.cpu_slots = cpu_slots
        self.token = token
        self.token_file = None
        if token is not None:
            self.token_file = self.root / "token"
            self.token_file.write_text(token + "\n")
        self.extra = list(extra)
        self.env = env
        self.proc = None
        self.port = None
        self.starts = 0
        self.seen = {}  # pid -> start time of every worker seen, to check they are gone
        self.stderr_path = None

    # -- life cycle

    def start(self, timeout=20):
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        self.stderr_path = self.root / f"server-{self.starts}.err"
        cmd = [str(self.bin / "ddpd"), "serve", "--listen", "127.0.0.1:0", "--db", str(self.db),
               "--data-dir", str(self.data_dir), "--cpu-slots", str(self.cpu_slots), "--gpus", "none"]
        if self.token_file:
            cmd += ["--token-file", str(self.token_file)]
        cmd += self.extra
        env = dict(os.environ)
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        if self.env:
            env.update(self.env)
        with open(self.stderr_path, "wb") as errf:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf,
                                         cwd=str(self.root), env=env, start_new_session=True)
        self.cmd = cmd

        def port():
            m = self.PORT_RE.search(self.stderr())
            if m:
                return int(m.group(1))
            if self.proc.poll() is not None:
                raise AssertionError(f"ddpd serve exited with {self.proc.returncode} before listening:\n"
                                     f"{' '.join(cmd)}\n{self.stderr()[-3000:]}")
            return None

        self.port = wait_until(port, timeout, "the server's 'listening ... (port N)' line")
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def stderr(self):
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def pid(self):
        return self.proc.pid

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def note_workers(self):
        """Records (and returns) the live ddpd-worker children of the server."""
        out = []
        if self.running():
            for pid, comm in children(self.proc.pid):
                st = proc_stat(pid)
                if st and comm.startswith("ddpd-worker"):
                    self.seen[pid] = st[2]
                    out.append(pid)
        return out

    def note_pid(self, pid):
        st = proc_stat(pid)
        if st:
            self.seen[pid] = st[2]

    def live_workers(self):
        """Workers this server was seen to start that still run."""
        return [p for p, t in self.seen.items() if alive(p, t)]

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Sends `sig` and waits for the exit; SIGKILL after `timeout`. Returns the exit code."""
        if self.proc is None:
            return None
        self.note_workers()
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                raise AssertionError(f"ddpd serve did not exit within {timeout}s of signal {sig}")
        return self.proc.returncode

    def kill9(self):
        self.note_workers()
        self.proc.kill()
        self.proc.wait(timeout=10)

    def assert_no_workers(self, timeout=10):
        left = []

        def none_left():
            nonlocal left
            left = self.live_workers()
            return not left

        try:
            wait_until(none_left, timeout, "the server's workers to be gone")
        except AssertionError:
            for p in left:  # do not leak them into other tests
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            raise AssertionError(f"workers still alive {timeout}s after the server stopped: {left}")

    # -- HTTP

    def headers(self, extra=None, auth=True):
        h = {}
        if auth and self.token:
            h["Authorization"] = f"Bearer {self.token}"
        if extra:
            h.update(extra)
        return h

    def request(self, method, path, auth=True, headers=None, timeout=15, **kw):
        import requests
        return requests.request(method, self.url + path, headers=self.headers(headers, auth), timeout=timeout, **kw)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, **kw):
        return self.request("POST", path, **kw)

    def delete(self, path, **kw):
        return self.request("DELETE", path, **kw)

    def submit(self, spec, expect=201):
        r = self.post("/v1/jobs", json=spec)
        assert r.status_code == expect, f"POST /v1/jobs: {r.status_code} {r.text}"
        return r.json()

    def job(self, jid):
        r = self.get(f"/v1/jobs/{jid}")
        assert r.status_code == 200, f"GET /v1/jobs/{jid}: {r.status_code} {r.text}"
        j = r.json()
        for rk in j.get("ranks") or []:
            if rk.get("pid") and rk.get("state") in ("starting", "running"):
                self.note_pid(rk["pid"])
        return j

    def wait_state(self, jid, states, timeout=60):
        states = {states} if isinstance(states, str) else set(states)
        return wait_until(lambda: (lambda j: j if j["state"] in states else None)(self.job(jid)), timeout,
                          f"job {jid} to reach {sorted(states)} (server stderr tail: {self.stderr()[-800:]!r})")

    def wait_running(self, jid, timeout=60):
        """Waits until the job runs with every rank started and its pid known."""
        def ok():
            j = self.job(jid)
            if j["state"] in ("succeeded", "failed", "cancelled"):
                raise AssertionError(f"job {jid} finished before it was seen running: {j}")
            rs = j.get("ranks") or []
            if j["state"] == "running" and len(rs) == j["world_size"] and all(
                    r.get("pid") and r["state"] == "running" for r in rs):
                return j
            return None
        return wait_until(ok, timeout, f"job {jid} to be running with every rank")

    def devices(self):
        r = self.get("/v1/devices")
        assert r.status_code == 200, r.text
        return r.json()

    def free_cpu_slots(self):
        return sum(1 for s in self.devices()["cpu_slots"] if s["job"] is None)

    def events(self, jid, timeout=60, **params):
        """Every event of a finished job through NDJSON (the stream ends by itself)."""
        import requests
        r = requests.get(f"{self.url}/v1/jobs/{jid}/events", params=dict(format="ndjson", **params),
                         headers=self.headers(), timeout=timeout)
        assert r.status_code == 200, r.text
        return [json.loads(ln) for ln in r.text.splitlines() if ln.strip()]


def sanitizer_report(text, lines=40):
    """The first sanitizer report in a server's stderr (and every SUMMARY line), or its
    tail when there is none."""
    ls = text.splitlines()
    start = next((i for i, l in enumerate(ls) if "WARNING: ThreadSanitizer" in l or "ERROR: AddressSanitizer" in l
                  or "runtime error:" in l), None)
    if start is None:
        return text[-2000:]
    summ = [l for l in ls if l.startswith("SUMMARY:")]
    return "\n".join(ls[start:start + lines] + ["..."] + summ)


@pytest.fixture
def make_server(work):
    """Factory: make_server(cpu_slots=2, token=None, ...) -> a started Server in its own
    folder. Every server made is stopped at teardown (SIGTERM, then SIGKILL) and none of
    its workers may outlive it."""
    made = []

    def make(start=True, **kw):
        s = Server(work / f"srv{len(made)}", **kw)
        made.append(s)
        return s.start() if start else s

    yield make
    errors = []
    for s in made:
        try:
            if s.running():
                rc = s.stop()
                if rc not in (0, -signal.SIGKILL):
                    errors.append(f"ddpd serve exited with {rc} on SIGTERM:\n{sanitizer_report(s.stderr())}")
            s.assert_no_workers()
        except AssertionError as e:
            errors.append(str(e))
    if errors:
        pytest.fail("teardown: " + "\n".join(errors), pytrace=False)


@pytest.fixture
def server(make_server):
    """A server with 2 CPU slots."""
    return make_server(cpu_slots=2)


# ---------------------------------------------------------------------------------------
# job specs


def seed_spec(**over):
    """examples/seed.json with overrides (None deletes a key)."""
    s = json.loads(SEED_SPEC.read_text())
    for k, v in over.items():
        if v is None:
            s.pop(k, None)
        else:
            s[k] = v
    return s


_slowdown = None


def slowdown():
    """How much slower than a plain build the workers run: 9 under ThreadSanitizer, 3
    under AddressSanitizer (read from the worker binary), or DDPD_API_SLOWDOWN."""
    global _slowdown
    if _slowdown is None:
        _slowdown = 1.0
        if os.environ.get("DDPD_API_SLOWDOWN"):
            _slowdown = float(os.environ["DDPD_API_SLOWDOWN"])
        elif bin_dir() is not None:
            blob = (bin_dir() / "ddpd-worker").read_bytes()
            if b"libtsan.so" in blob or b"__tsan_init" in blob:
                _slowdown = 9.0
            elif b"libasan.so" in blob or b"__asan_init" in blob:
                _slowdown = 3.0
    return _slowdown


def heavy_spec(world_size=1, *, steps, **over):
    """A job of `steps` steps of a 10-256-5 MLP (batch 32). How long that takes depends on
    the machine: `ddpd run` of it (one loss event) took 77,000-84,000 steps/s with 1 rank,
    23,000-25,000 with 2 and 12,600-14,600 with 3 on the 2-core development machine at a
    load of about 4 (2026-12-03), 7 to 9 times the rates of the old table here. A test
    that must see the job still running uses steps=FOREVER_STEPS and cancels it, or a
    HeldWorker or PausingWorker, never a step count it expects to take long enough."""
    s = seed_spec(name=over.pop("name", "heavy"), world_size=world_size, epochs=None, steps=steps,
                  model=[{"type": "linear", "in": 10, "out": 256}, {"type": "relu"},
                         {"type": "linear", "in": 256, "out": 5}],
                  batch_size=32, data={"type": "synthetic", "samples": 4096, "seed": 1},
                  log_every=max(1, steps // 50))
    s.update(over)
    return s


FOREVER_STEPS = 10_000_000  # a job that outlives any test: to be cancelled or killed


class _WorkerStandIn:
    """A Python stand-in for ddpd-worker in `folder` (start the server with env=w.env):
    the worker's other uses (--plan, --issue-id, --devices) exec the real worker; a rank
    runs `body` (which starts the real worker as `worker` and may wait for the test's
    release()), then exits as the worker did. The server starts a rank with SIGTERM
    blocked (the worker unblocks it once it handles it): the real worker inherits that,
    and the stand-in unblocks it after starting it, so a cancel ends both at once."""

    HOLD_MAX_S = 300  # the longest a rank waits for release()

    def __init__(self, folder, name, body):
        b = bin_dir()
        if b is None:
            pytest.skip("ddpd is not built (set DDPD_BIN to the build folder)")
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.gate = folder / f"{name}-release"
        self.path = folder / name
        self.path.write_text(f"""#!/usr/bin/python3
import fcntl, json, os, signal, subprocess, sys, time
REAL, GATE, HOLD_MAX_S = {str(b / "ddpd-worker")!r}, {str(self.gate)!r}, {self.HOLD_MAX_S}
if sys.argv[1:]:
    os.execv(REAL, [REAL] + sys.argv[1:])


def real_worker(**kw):
    # The real worker, which dies with this stand-in (PR_SET_PDEATHSIG, SIGKILL): a rank
    # is one process to the launcher, so nothing of an attempt may outlive the process it
    # reaped (a worker left running wrote ckpt-200 after the restart had chosen ckpt-150).
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def die_with_parent():
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the stand-in died before the prctl
            os._exit(137)
    return subprocess.Popen([REAL], preexec_fn=die_with_parent, **kw)


def hold():
    deadline = time.monotonic() + HOLD_MAX_S
    while not os.path.exists(GATE) and time.monotonic() < deadline:
        time.sleep(0.02)


{body}
rc = worker.wait() if rc is None else rc
if rc < 0:
    signal.signal(-rc, signal.SIG_DFL)
    os.kill(os.getpid(), -rc)
sys.exit(rc)
""")
        self.path.chmod(0o755)
        self.env = {"DDPD_WORKER": str(self.path)}

    def release(self):
        """Lets every rank waiting for it go on (and ranks started later not wait)."""
        self.gate.touch()


class HeldWorker(_WorkerStandIn):
    """A job the test sees running for as long as it needs, that then ends on its own as
    its ranks did (succeeded), however fast they trained: each rank runs the real worker to
    its end, then stays running, holding the worker's exit code, until release()."""

    def __init__(self, folder):
        super().__init__(folder, "held-worker", """
worker = real_worker()
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
rc = worker.wait()
hold()
""")


class PausingWorker(_WorkerStandIn):
    """A job paused mid-run: each rank runs the real worker with its events piped through
    the stand-in, which stops passing them on after the first checkpoint event at a step
    >= `at_step` until release(). The rank then blocks on its next events (the pipe holds
    4 KiB, some 25 events) and its peers in their collectives: a job of many more steps
    than that after `at_step` cannot end while paused, however fast it trains. Killing a
    rank's process (the stand-in) ends its worker too: its events have nowhere to go."""

    def __init__(self, folder, at_step):
        super().__init__(folder, "pausing-worker", f"""
AT = {int(at_step)}
r, w = os.pipe()
fcntl.fcntl(w, 1031, 4096)  # F_SETPIPE_SZ: the worker blocks soon after the events stop
worker = real_worker(stdout=w)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGTERM}})
os.close(w)
rc = None
for line in os.fdopen(r, "rb"):
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
    if b'"checkpoint"' in line and not os.path.exists(GATE):
        ev = json.loads(line)
        if ev.get("event") == "checkpoint" and ev.get("step", 0) >= AT:
            hold()
""")


# ---------------------------------------------------------------------------------------
# event streams through the real curl binary


class CurlStream:
    """`curl -sS -N URL` in the background; its output parsed as SSE frames or NDJSON
    lines into event dicts (SSE frames also get "_id" and "_event" from their fields)."""

    def __init__(self, url, fmt="sse", headers=(), max_time=120):
        self.fmt = fmt
        cmd = ["curl", "-sS", "-N", "--max-time", str(max_time)]
        for h in headers:
            cmd += ["-H", h]
        cmd.append(url)
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.q = queue.Queue()
        self.raw = []  # every line as received
        self.comments = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        frame = {}
        data = []
        try:
            for raw in self.proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                self.raw.append(line)
                if self.fmt == "ndjson":
                    if line.strip():
                        self.q.put(json.loads(line))
                    continue
                if line == "":
                    if data:
                        ev = json.loads("\n".join(data))
                        ev["_id"] = frame.get("id")
                        ev["_event"] = frame.get("event")
                        self.q.put(ev)
                    frame, data = {}, []
                elif line.startswith(":"):
                    self.comments.append(line)
                else:
                    k, _, v = line.partition(":")
                    v = v[1:] if v.startswith(" ") else v
                    if k == "data":
                        data.append(v)
                    else:
                        frame[k] = v
        except Exception as e:  # surfaces in next()
            self.q.put(e)
        finally:
            self.q.put(None)

    def next(self, timeout=30):
        """The next event; None at the end of the stream; AssertionError on timeout."""
        try:
            ev = self.q.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no event within {timeout}s from {' '.join(self.cmd)}")
        if isinstance(ev, Exception):
            raise ev
        if ev is None:
            self.q.put(None)  # stays at the end
        return ev

    def until(self, pred, timeout=60):
        """Events up to and including the first for which pred(ev) holds."""
        deadline = time.monotonic() + timeout
        got = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out after {timeout}s; {len(got)} events, last {got[-3:]}")
            ev = self.next(left)
            if ev is None:
                raise AssertionError(f"stream ended before the awaited event; last {got[-3:]}")
            got.append(ev)
            if pred(ev):
                return got

    def rest(self, timeout=60):
        """Every remaining event, up to the end of the stream (bounded)."""
        deadline = time.monotonic() + timeout
        got = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the stream did not end within {timeout}s; last {got[-3:]}")
            ev = self.next(left)
            if ev is None:
                self.wait(10)
                return got
            got.append(ev)

    def wait(self, timeout=10):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise AssertionError("curl did not exit after the stream ended")

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def stderr(self):
        return self.proc.stderr.read().decode(errors="replace") if self.proc.poll() is not None else ""


@pytest.fixture
def curl_streams():
    """Factory for CurlStream; every stream is killed at teardown."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    made = []

    def make(*a, **kw):
        s = CurlStream(*a, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


# ---------------------------------------------------------------------------------------
# raw sockets


def raw_http(port, data, timeout=10):
    """Sends `data` on a fresh connection, reads until the server closes or `timeout`;
    returns the bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            if not b:
                break
            out += b
        return out


def final_state_events(evs):
    return [e for e in evs if e.get("event") == "state" and e.get("state") in ("succeeded", "failed", "cancelled")]
