"""infer.py — inference in the tests, two halves (issue 29).

The worker's half: driving `ddpd-worker --infer` over its pipes (docs/generation.md "The worker's
protocol"), for the parity tests of inference and bench/generate.py: a Worker whose every
read has a deadline, and the pieces of the PyTorch side (the module tree of a spec with a
model.safetensors loaded into it, nanoGPT-style greedy decoding, the documented draw).

The server's half: what the inference API tests (tests/api/test_infer_*.py) share: a server whose
inference worker is the stand-in tests/helpers/infer_worker.py (its knobs in a control
file, what it saw in a log), tiny jobs trained through the server whose models the tests
ask for (a GPT over a byte vocabulary, one over 65 tokens, an MLP), and reads of
GET /v1/inference.

Which worker answers: the stand-in answers itself ("fake") unless the real ddpd-worker
speaks --infer, in which case the stand-in passes every line to it ("proxy", the knobs
applied on the way), so the same tests check the server against the real worker after
the merge. DDPD_TEST_INFER=fake or real forces one (real fails when the worker cannot);
DDPD_TEST_INFER_WORKER names another ddpd-worker to proxy to (default: DDPD_BIN's).
"""
import json
import os
import select
import subprocess
import time
from pathlib import Path

import pytest

from pylib.common import REPO, bin_dir, device_env, on_emulated_gpu
from pylib.safetensors import st_load
from pylib.server import seed_spec, wait_until


class Worker:
    """One `ddpd-worker --infer` process. `request` sends a line and returns (stream lines,
    final line); every read waits at most `timeout` seconds, then fails the test."""

    def __init__(self, env=None, log=None):
        d = bin_dir()
        assert d is not None, "ddpd-worker is not built (set DDPD_BIN)"
        e = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        e = device_env(e, 1)
        e.update(env or {})
        self.log_path = log
        self.log = open(log, "wb") if log else subprocess.DEVNULL
        self.p = subprocess.Popen([str(d / "ddpd-worker"), "--infer"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.log, env=e)
        self.buf = b""

    @property
    def device(self):
        """The device the parity run loads models on: the emulated GPU under parity_emu."""
        return "cuda" if on_emulated_gpu() else "cpu"

    def send(self, obj):
        data = obj if isinstance(obj, (bytes, bytearray)) else (json.dumps(obj) + "\n").encode()
        self.p.stdin.write(data)
        self.p.stdin.flush()

    def line(self, timeout=120):
        """The next stdout line, parsed; fails after `timeout` seconds or at EOF."""
        deadline = time.monotonic() + timeout
        fd = self.p.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            assert left > 0, f"no line from ddpd-worker --infer within {timeout} s (have {self.buf[-200:]!r})"
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 1 << 20)
                assert chunk, f"ddpd-worker --infer ended (exit {self.p.poll()}); stderr: {self.stderr()}"
                self.buf += chunk
        ln, self.buf = self.buf.split(b"\n", 1)
        return json.loads(ln)

    def final(self, timeout=120):
        """(stream lines, final line) of one request already sent."""
        stream = []
        while True:
            o = self.line(timeout)
            if "ok" in o:
                return stream, o
            stream.append(o)

    def request(self, obj, timeout=120):
        self.send(obj)
        return self.final(timeout)

    def ok(self, obj, timeout=120):
        stream, o = self.request(obj, timeout)
        assert o.get("ok") is True, f"{obj.get('op')}: {o}"
        return stream, o

    def load(self, spec, weights, **kw):
        req = dict({"op": "load", "spec": spec, "weights": str(weights), "device": self.device}, **kw)
        return self.ok(req)[1]

    def stderr(self):
        if not self.log_path:
            return "(not kept)"
        self.log.flush()
        return Path(self.log_path).read_text(errors="replace")[-3000:]

    def close(self, timeout=30):
        """Closes stdin (EOF: the worker exits 0) and returns its exit code."""
        try:
            self.p.stdin.close()
        except BrokenPipeError:
            pass
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            rc = "timeout"
        if self.log is not subprocess.DEVNULL:
            self.log.close()
        return rc


# ---------------------------------------------------------------------------------------
# the PyTorch side


def torch_model(spec_model, weights):
    """The spec's module tree (pylib.torch_models) with `weights` (a model.safetensors) loaded
    strictly, in eval mode."""
    import numpy as np
    import torch
    from pylib import torch_models
    m = torch_models.build(spec_model)
    sd = {k: torch.from_numpy(np.asarray(v)) for k, v in st_load(weights, strict=False)[0].items()}
    m.load_state_dict(sd, strict=True)
    return m.eval()


def greedy(model, prompt, n, block):
    """nanoGPT's sample.py at temperature 0: the context is the last `block` tokens, the
    next token the argmax (torch's: the first maximum) of the last position's logits."""
    import torch
    idx = torch.tensor([list(prompt)], dtype=torch.long)
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(idx[:, -block:])[0, -1]
            t = int(torch.argmax(logits))
            out.append(t)
            idx = torch.cat([idx, torch.tensor([[t]])], dim=1)
    return out


def last_logits(model, prompt, block):
    """The float64 logits of the token after `prompt` (cropped to `block`)."""
    import torch
    with torch.no_grad():
        return model(torch.tensor([list(prompt)[-block:]], dtype=torch.long))[0, -1].double().numpy()


M64 = (1 << 64) - 1


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return x, z ^ (z >> 31)


def draw(seed, n):
    """u of the n-th new token of a request with `seed` (docs/generation.md "Sampling")."""
    x = (seed ^ (n * 0xD1B54A32D192ED03)) & M64
    s = []
    for _ in range(4):
        x, z = _splitmix64(x)
        s.append(z)
    v = (s[1] * 5) & M64
    result = ((((v << 7) | (v >> 57)) & M64) * 9) & M64
    return (result >> 11) * 2.0 ** -53


def sample(logits, temperature, top_k, seed, n):
    """The documented sampling rule in numpy, and the margin of its draw: how far u·S is from
    the nearest boundary of the running sum, relative to S (a draw this close to a boundary
    may go the other way on logits that differ by float32 rounding)."""
    import numpy as np
    l = np.asarray(logits, dtype=np.float64)
    V = len(l)
    keep = np.ones(V, dtype=bool)
    if 0 < top_k < V:
        order = sorted(range(V), key=lambda i: (-l[i], i))
        keep[:] = False
        keep[order[:top_k]] = True
    m = l[keep].max()
    p = np.where(keep, np.exp((l - m) / temperature), 0.0)
    s = 0.0
    run = []
    for v in p:
        s += v
        run.append(s)
    target = draw(seed, n) * s
    tok = next((i for i in range(V) if p[i] > 0 and run[i] > target), max(i for i in range(V) if p[i] > 0))
    margin = min(abs(r - target) for r in run) / s
    return tok, margin


# ---------------------------------------------------------------------------------------
# the inference API tests' servers

HELPER = REPO / "tests" / "helpers" / "infer_worker.py"
TEXT = (b"First Citizen: Before we proceed any further, hear me speak. All: Speak, speak. "
        b"First Citizen: You are all resolved rather to die than to famish? ") * 8

_real = None


def real_worker():
    """The real ddpd-worker when it speaks --infer (and DDPD_TEST_INFER is not fake), else None."""
    global _real
    if _real is None:
        mode = os.environ.get("DDPD_TEST_INFER", "auto")
        w = Path(os.environ["DDPD_TEST_INFER_WORKER"]) if os.environ.get("DDPD_TEST_INFER_WORKER") else (
            bin_dir() / "ddpd-worker" if bin_dir() else None)
        ok = False
        if mode != "fake" and w and w.exists():
            try:
                p = subprocess.run([str(w), "--infer"], input=b'{"op": "unload"}\n', capture_output=True,
                                   timeout=60)
                first = p.stdout.decode(errors="replace").splitlines()[:1]
                ok = bool(first) and isinstance(json.loads(first[0]), dict) and "ok" in json.loads(first[0])
            except (OSError, ValueError, subprocess.TimeoutExpired):
                ok = False
        if mode == "real" and not ok:
            raise AssertionError(f"DDPD_TEST_INFER=real but {w} --infer does not answer the protocol")
        _real = str(w) if ok else ""
    return _real or None


class Infer:
    """A server with the stand-in worker: .srv (pylib.server.Server), .ctl(**knobs), .log()."""

    def __init__(self, make_server, work, procs=2, queue=None, memory=None, idle_s=None, timeout_s=None,
                 max_bytes=None, extra=(), env=None, **kw):
        self.ctl_path = Path(work) / f"infer-ctl-{id(self)}.json"
        self.log_path = Path(work) / f"infer-log-{id(self)}.jsonl"
        self.ctl()
        args = ["--infer-worker", str(HELPER), "--infer-procs", str(procs)]
        for opt, v in (("--infer-queue", queue), ("--infer-memory", memory), ("--infer-idle-s", idle_s),
                       ("--infer-timeout-s", timeout_s), ("--infer-max-bytes", max_bytes)):
            if v is not None:
                args += [opt, str(v)]
        e = {"DDPD_TEST_INFER_CTL": str(self.ctl_path), "DDPD_TEST_INFER_LOG": str(self.log_path),
             "DDPD_TEST_INFER_REAL": real_worker() or ""}
        e.update(env or {})
        self.srv = make_server(extra=list(args) + list(extra), env=e, **kw)
        self.srv.infer_pids = set()

    def ctl(self, **knobs):
        """Sets the stand-in's knobs for the requests from now on."""
        tmp = self.ctl_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(knobs))
        tmp.replace(self.ctl_path)

    def log(self):
        """The stand-in's events so far (every process's)."""
        try:
            return [json.loads(ln) for ln in self.log_path.read_text().splitlines() if ln.strip()]
        except FileNotFoundError:
            return []

    def status(self):
        r = self.srv.get("/v1/inference")
        assert r.status_code == 200, r.text
        st = r.json()
        self.srv.infer_pids.update(p["pid"] for p in st["processes"] if p["pid"])
        return st

    def generate(self, jid, timeout=120, **body):
        return self.srv.post(f"/v1/jobs/{jid}/generate", json=body, timeout=timeout)

    def predict(self, jid, timeout=120, **body):
        return self.srv.post(f"/v1/jobs/{jid}/predict", json=body, timeout=timeout)

    def wait_status(self, pred, what, timeout=60):
        return wait_until(lambda: (lambda s: s if pred(s) else None)(self.status()), timeout, what)


# ---- jobs whose models the tests ask for ------------------------------------------------------

def gpt_spec(vocab=256, T=8, steps=4, every=2, name="gpt"):
    """A tiny GPT over `vocab` tokens of window T, checkpoints every `every` steps."""
    model = [{"type": "embedding", "num": vocab, "dim": 16}, {"type": "position", "max": T, "dim": 16},
             {"type": "residual", "layers": [{"type": "layernorm", "dim": 16},
                                             {"type": "attention", "dim": 16, "heads": 2, "causal": True}]},
             {"type": "layernorm", "dim": 16}, {"type": "linear", "in": 16, "out": vocab}]
    return seed_spec(name=name, model=model, input_shape=[T], loss="cross_entropy", epochs=None, steps=steps,
                     optimizer={"type": "adamw", "lr": 0.01}, batch_size=4, log_every=1,
                     data={"type": "tokens", "path": f"train-{vocab}.bin", "block_size": T, "seed": 1},
                     checkpoint={"every_steps": every, "keep_last": 5})


def mlp_spec(steps=4, every=2, name="mlp", **over):
    """The seed MLP (10 -> 5) as a classifier, checkpoints every `every` steps."""
    s = seed_spec(name=name, epochs=None, steps=steps, loss="cross_entropy",
                  model=[{"type": "linear", "in": 10, "out": 16}, {"type": "relu"},
                         {"type": "linear", "in": 16, "out": 5}],
                  data={"type": "synthetic", "samples": 64, "seed": 1}, batch_size=8, log_every=1,
                  checkpoint={"every_steps": every, "keep_last": 5})
    s.update(over)
    return s


def write_tokens(srv, vocab):
    import numpy as np
    ids = np.frombuffer(TEXT, dtype=np.uint8).astype(np.uint16) % vocab
    ids.astype(np.uint16).tofile(srv.data_dir / f"train-{vocab}.bin")


def train(srv, spec, vocab=None, timeout=180):
    """Submits `spec` (writing its tokens file for a GPT) and waits for it to succeed; its id."""
    if vocab:
        write_tokens(srv, vocab)
    jid = srv.submit(spec)["id"]
    j = srv.wait_state(jid, ("succeeded", "failed", "cancelled"), timeout=timeout)
    assert j["state"] == "succeeded", j
    return jid


def stream_lines(resp):
    """The NDJSON lines of a streamed answer."""
    return [json.loads(ln) for ln in resp.iter_lines() if ln.strip()]


def sse_frames(text):
    """(event, data) of each SSE frame of `text`."""
    out = []
    for frame in text.split("\n\n"):
        ev, data = None, []
        for ln in frame.splitlines():
            if ln.startswith("event: "):
                ev = ln[7:]
            elif ln.startswith("data: "):
                data.append(ln[6:])
        if data:
            out.append((ev, json.loads("\n".join(data))))
    return out


def pids_alive(pids):
    from pylib.server import alive
    return [p for p in pids if alive(p)]


@pytest.fixture
def infer_server(make_server, work):
    """Factory: infer_server(procs=2, queue=..., memory=..., ...) -> Infer. At teardown the
    inference processes each server was seen to run must be gone."""
    made = []

    def make(**kw):
        i = Infer(make_server, work, **kw)
        made.append(i)
        return i

    yield make
    for i in made:
        if i.srv.running():
            try:
                i.status()
            except Exception:  # noqa: BLE001 (a server that no longer answers: its pids are noted)
                pass
            i.srv.stop()
        wait_until(lambda: not pids_alive(i.srv.infer_pids), 20,
                   f"the inference processes {sorted(i.srv.infer_pids)} to end with the server")
