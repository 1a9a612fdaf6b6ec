"""infer.py — driving `ddpd-worker --infer` over its pipes (docs/generation.md "The worker's
protocol"), for the parity tests of inference and bench/generate.py: a Worker whose every
read has a deadline, and the pieces of the PyTorch side (the module tree of a spec with a
model.safetensors loaded into it, nanoGPT-style greedy decoding, the documented draw).
"""
import json
import os
import select
import subprocess
import time
from pathlib import Path

from pylib.common import bin_dir, device_env, on_emulated_gpu
from pylib.safetensors import st_load


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
