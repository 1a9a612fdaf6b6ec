"""load_common.py — what bench/load-submit, bench/load-sse and bench/load-flood share:
the build folder, a `ddpd serve` on 127.0.0.1 with its stderr in a file, small HTTP
helpers (stdlib only), percentiles, the server's RSS. Loopback only; every wait bounded."""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def log(*a):
    print(*a, flush=True)


def die(name, msg):
    sys.exit(f"{name}: {msg}")


def find_build(name, build, targets=()):
    """The build folder (with ddpd and ddpd-worker), after `cmake --build` of `targets`."""
    cands = [build] if build else ["build", "build-faults"]
    for d in cands:
        d = d if os.path.isabs(d) else os.path.join(REPO, d)
        if os.access(os.path.join(d, "ddpd"), os.X_OK):
            d = os.path.abspath(d)
            r = subprocess.run(["cmake", "--build", d, "--target", "ddpd", "ddpd-worker", *targets],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode:
                have = all(os.access(os.path.join(d, t), os.X_OK) or os.access(os.path.join(d, "bench", t), os.X_OK)
                           for t in ("ddpd", "ddpd-worker", *targets))
                if not have:
                    die(name, "cmake --build failed:\n" + r.stdout[-3000:])
                log(f"# {name}: warning: cmake --build failed; using the existing binaries")
            return d
    die(name, "no build folder with ddpd; build one and pass --build DIR")


def pct(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(p / 100.0 * (len(s) - 1)))))]


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            m = re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M)
            return int(m.group(1)) if m else 0
    except OSError:
        return 0


class Server:
    """`ddpd serve` in `root`, its stderr in root/serve.err; .port once it listens."""

    def __init__(self, name, build, root, cpu_slots, env=None, extra=()):
        os.makedirs(os.path.join(root, "data"), exist_ok=True)
        self.errfile = os.path.join(root, "serve.err")
        self.db = os.path.join(root, "ddpd.db")
        e = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        e.update(env or {})
        args = [os.path.join(build, "ddpd"), "serve", "--listen", "127.0.0.1:0", "--db", self.db, "--data-dir",
                os.path.join(root, "data"), "--cpu-slots", str(cpu_slots), "--gpus", "none", *extra]
        self.err = open(self.errfile, "w")
        self.p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.err, env=e, start_new_session=True)
        self.port = None
        deadline = time.time() + 20
        while time.time() < deadline and self.port is None:
            with open(self.errfile) as f:
                m = re.search(r"\(port (\d+)\)", f.read())
            if m:
                self.port = int(m.group(1))
            elif self.p.poll() is not None:
                break
            else:
                time.sleep(0.02)
        if self.port is None:
            self.stop()
            die(name, "ddpd serve did not start:\n" + self.stderr()[-2000:])

    def stderr(self):
        with open(self.errfile) as f:
            return f.read()

    def stop(self, timeout=30):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.err.close()
        return self.p.returncode

    def request(self, method, path, body=None, timeout=30):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            h = {"Content-Type": "application/json"} if body is not None else {}
            c.request(method, path, body=None if body is None else json.dumps(body), headers=h)
            r = c.getresponse()
            data = r.read()
            ct = r.getheader("Content-Type", "")
            return r.status, (json.loads(data) if data and ct.startswith("application/json") else data)
        finally:
            c.close()

    def metric(self, name):
        st, body = self.request("GET", "/metrics")
        m = re.search(rb"^" + name.encode() + rb" (\d+)", body if isinstance(body, bytes) else b"", re.M)
        return int(m.group(1)) if m else -1

    def wait_job(self, jid, states, timeout):
        deadline = time.time() + timeout
        j = None
        while time.time() < deadline:
            st, j = self.request("GET", f"/v1/jobs/{jid}")
            if st == 200 and j["state"] in states:
                return j
            time.sleep(0.05)
        return j


def seed_spec(**over):
    with open(os.path.join(REPO, "examples", "seed.json")) as f:
        s = json.load(f)
    s.pop("epochs", None)
    s.update(over)
    return s


def tiny_spec(name, **over):
    """Linear(2,1), 1 step: the cheapest real job."""
    return seed_spec(name=name, steps=1, model=[{"type": "linear", "in": 2, "out": 1}],
                     data={"type": "synthetic", "samples": 8, "seed": 1}, batch_size=2, device="cpu", **over)
