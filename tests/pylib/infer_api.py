"""infer_api.py — what the inference API tests (tests/api/test_infer_*.py) share: a server whose
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
import subprocess
from pathlib import Path

import pytest

from pylib.common import REPO, bin_dir
from pylib.server import seed_spec, wait_until

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
