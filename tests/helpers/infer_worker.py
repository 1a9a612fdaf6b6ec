#!/usr/bin/python3
"""infer_worker.py — a test helper: a stand-in for `ddpd-worker --infer` that the API tests
run as `ddpd serve --infer-worker` (tests/api/test_infer_*.py). Not a product program.

It speaks the protocol of docs/architecture.md ("How an inference request flows"): one
JSON object per line on stdin, one per line on stdout, a final line per request, token
lines before a streamed generate's final, `cancel` polled between tokens and ignored when
nothing runs, EOF -> exit 0.

Two modes:
- fake (default): it answers itself. `load` reads the spec's model (GPT: embedding first,
  vocabulary `num`; block size input_shape[0]) and answers resident_bytes = the weights'
  file size + 4096; `generate` makes ids from the seed and the prompt (the same request,
  the same ids), checks ids and the prompt as the worker does; `predict` checks each
  sample's shape against input_shape (naming inputs[i]) and answers, per sample, the last
  layer's width of numbers made from the sample's sum (top classes for cross_entropy).
- proxy (DDPD_TEST_INFER_REAL=path of the real ddpd-worker): every line goes to the real
  `ddpd-worker --infer` and its answers come back, with the knobs below applied on the way.

Knobs, read at every request from the JSON file DDPD_TEST_INFER_CTL (absent: none):
  delay_s        seconds before each token line is passed on
  crash_after    exit with `exit_code` (default 3) after this many token lines of a generate
  crash_on_load  exit with `exit_code` on a load
  hang_after     stop answering (sleep) after this many token lines
  resident_bytes the load answer's resident_bytes: a number, or {job id: number}
  tokens         (fake only) the ids a generate makes, in order, before its own
DDPD_TEST_INFER_LOG names a file that gets one JSON line per event of this process
({"pid", "event": "start"|"load"|"request"|"cancel"|"final"|"exit", ...}), which the
tests read to see what the worker saw."""
import json
import math
import os
import select
import subprocess
import sys
import threading
import time

CTL = os.environ.get("DDPD_TEST_INFER_CTL")
LOG = os.environ.get("DDPD_TEST_INFER_LOG")
REAL = os.environ.get("DDPD_TEST_INFER_REAL")


def log(event, **kw):
    if not LOG:
        return
    kw.update(pid=os.getpid(), event=event, t=time.time())
    with open(LOG, "a") as f:
        f.write(json.dumps(kw) + "\n")


def ctl():
    try:
        with open(CTL) as f:
            return json.load(f)
    except (OSError, ValueError, TypeError):
        return {}


def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def job_of(weights):
    """The job id of a weights path .../jobs/ID/model.safetensors or .../ID/ckpt-N/..."""
    parts = weights.split("/")
    for p in reversed(parts[:-1]):
        if p.isdigit():
            return p
    return "?"


def resident_override(c, weights):
    r = c.get("resident_bytes")
    if isinstance(r, dict):
        return r.get(job_of(weights))
    return r


class Stdin:
    """Lines of fd 0, read without blocking when asked."""

    def __init__(self):
        self.buf = b""
        self.eof = False

    def line(self, timeout=None):
        while b"\n" not in self.buf:
            if self.eof:
                return None
            r, _, _ = select.select([0], [], [], timeout)
            if not r:
                return ""  # nothing now
            b = os.read(0, 65536)
            if not b:
                self.eof = True
                continue
            self.buf += b
        ln, _, self.buf = self.buf.partition(b"\n")
        return ln.decode("utf-8", "replace")


def die(code):
    log("exit", code=code)
    sys.stdout.flush()
    os._exit(code)


def hang():
    log("hang")
    time.sleep(3600)
    os._exit(9)


# ---- fake mode ----------------------------------------------------------------------------

def err(code, path, message):
    out({"ok": False, "error": {"code": code, "path": path, "message": message}})


def shape_of(x):
    if isinstance(x, list):
        inner = [shape_of(e) for e in x]
        if not inner:
            return [0]
        if any(i != inner[0] for i in inner):
            return None
        return [len(x)] + (inner[0] if inner[0] is not None else [None])
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return []


def flat(x):
    if isinstance(x, list):
        for e in x:
            yield from flat(e)
    else:
        yield x


class Fake:
    def __init__(self, stdin):
        self.stdin = stdin
        self.model = None

    def load(self, req, c):
        spec = req.get("spec") or {}
        weights = req.get("weights", "")
        if not os.path.isfile(weights):
            return err("io_error", "weights", f"cannot open {weights}")
        if c.get("crash_on_load"):
            die(int(c.get("exit_code", 3)))
        layers = spec.get("model") or []
        top = layers[-1] if layers else {}
        first = layers[0] if layers else {}
        gpt = first.get("type") == "embedding" and top.get("type") == "linear" and top.get("out") == first.get("num")
        shape = spec.get("input_shape") or ([first.get("in")] if first.get("type") == "linear" else [])
        self.model = {"gpt": gpt, "vocab": first.get("num") if gpt else None, "shape": shape,
                      "block": shape[0] if gpt and shape else None, "out": top.get("out", 1),
                      "ce": spec.get("loss") == "cross_entropy"}
        rb = resident_override(c, weights)
        if rb is None:
            rb = os.path.getsize(weights) + 4096
        log("load", weights=weights, device=req.get("device"), gpu=req.get("gpu"),
            cuda_visible=os.environ.get("CUDA_VISIBLE_DEVICES"), nice=os.nice(0))
        out({"ok": True, "op": "load", "params": 0, "param_bytes": os.path.getsize(weights), "cache_bytes": 0,
             "resident_bytes": rb, "vocab": self.model["vocab"], "block_size": self.model["block"],
             "generate": gpt, "bytes_vocab": self.model["vocab"] == 256, "seconds": 0.001})

    def generate(self, req, c):
        m = self.model
        if not m["gpt"]:
            return err("invalid_spec", "model", "generate needs a GPT")
        V = m["vocab"]
        if "prompt" in req:
            if V != 256:
                return err("invalid_spec", "prompt", "prompt: not a byte vocabulary")
            ids = list(req["prompt"].encode("utf-8"))
        else:
            ids = req.get("ids") or []
        if not ids:
            return err("invalid_spec", "prompt" if "prompt" in req else "ids", "at least one token")
        for i, t in enumerate(ids):
            if not isinstance(t, int) or t < 0 or t >= V:
                return err("invalid_spec", f"ids[{i}]", f"ids[{i}]: {t} is outside [0, {V})")
        n = req.get("max_new_tokens", 256)
        seed = req.get("seed", 0)
        draw = seed if req.get("temperature", 1.0) != 0 else 0  # greedy: no draw, no seed
        stream = req.get("stream", False)
        crash_after, hang_after = c.get("crash_after"), c.get("hang_after")
        delay = float(c.get("delay_s", 0) or 0)
        new, text, cancelled = [], "", False
        t0 = time.monotonic()
        for k in range(n):
            if crash_after is not None and k >= crash_after:
                die(int(c.get("exit_code", 3)))
            if hang_after is not None and k >= hang_after:
                hang()
            forced = c.get("tokens") or []
            tok = forced[k] if k < len(forced) else (draw * 7919 + sum(ids) * 31 + k * 17 + (new[-1] if new else 0)) % V
            new.append(tok)
            # A byte vocabulary's text: ASCII as is (control characters too: the worker's
            # UTF-8 decoder passes them), other bytes as U+FFFD (the fake keeps no partial
            # sequences).
            piece = (chr(tok) if tok < 128 else "\ufffd") if V == 256 else None
            if piece is not None:
                text += piece
            if stream:
                line = {"token": tok}
                if piece is not None:
                    line["text"] = piece
                if delay:
                    time.sleep(delay)
                out(line)
            ln = self.stdin.line(0)
            while ln:  # cancel between tokens; anything else is out of protocol
                if json.loads(ln).get("op") == "cancel":
                    log("cancel", tokens=len(new))
                    cancelled = True
                ln = self.stdin.line(0)
            if cancelled:
                break
        block = m["block"] or len(ids)
        ans = {"ok": True, "op": "generate", "ids": new, "prompt_tokens": len(ids),
               "cropped": max(0, len(ids) - block), "seed": seed, "cancelled": cancelled,
               "seconds": time.monotonic() - t0}
        if V == 256:
            ans["text"] = text
        log("final", op="generate", tokens=len(new), cancelled=cancelled)
        out(ans)

    def predict(self, req, c):
        m = self.model
        if "inputs" in req:
            xs = req["inputs"]
        elif "npy" in req:
            import numpy as np
            xs = np.load(req["npy"]).tolist()
        elif "eval" in req:
            xs = [[0] * (m["shape"][0] if m["shape"] else 1)] * int(req["eval"]["count"])
        else:
            return err("invalid_spec", "inputs", "inputs: missing")
        want = list(m["shape"])
        outs, tops = [], []
        for i, x in enumerate(xs):
            got = shape_of(x)
            if got != want:
                return err("invalid_spec", f"inputs[{i}]", f"inputs[{i}]: expected shape {want}, got {got}")
            vals = list(flat(x))
            if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in vals):
                return err("invalid_spec", f"inputs[{i}]", f"inputs[{i}]: not a number")
            s = float(sum(vals))
            o = [round(s / (k + 1), 6) for k in range(m["out"])]
            outs.append(o)
            if m["ce"]:
                mx = max(o)
                e = [math.exp(v - mx) for v in o]
                z = sum(e)
                order = sorted(range(len(o)), key=lambda k: (-o[k], k))[:5]
                tops.append([{"class": k, "p": e[k] / z} for k in order])
        ans = {"ok": True, "op": "predict", "outputs": outs, "shape": [m["out"]]}
        if m["ce"]:
            ans["top"] = tops
        if "eval" in req:
            ans["labels"] = [0] * len(xs)
        log("final", op="predict", samples=len(xs))
        out(ans)

    def run(self):
        while True:
            ln = self.stdin.line(None)
            if ln is None:
                die(0)
            if not ln.strip():
                continue
            req = json.loads(ln)
            op = req.get("op")
            if op == "cancel":
                log("cancel", tokens=None)
                continue  # no generation runs: read and ignored
            c = ctl()
            log("request", op=op)
            if op == "load":
                self.load(req, c)
            elif op == "unload":
                self.model = None
                out({"ok": True, "op": "unload"})
            elif self.model is None:
                err("conflict", "", "no model loaded")
            elif op == "generate":
                self.generate(req, c)
            elif op == "predict":
                self.predict(req, c)
            else:
                err("invalid_spec", "op", f"unknown op {op}")


# ---- proxy mode -----------------------------------------------------------------------------

def proxy():
    child = subprocess.Popen([REAL, "--infer"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    state = {"c": {}, "op": None, "tokens": 0, "cancelled": False, "weights": ""}
    lock = threading.Lock()

    def kill_child_and(fn, *a):
        try:
            child.kill()
        except OSError:
            pass
        fn(*a)

    def pump_in():
        for raw in sys.stdin.buffer:
            ln = raw.decode("utf-8", "replace").strip()
            if not ln:
                continue
            req = json.loads(ln)
            op = req.get("op")
            with lock:
                if op == "cancel":
                    log("cancel", tokens=state["tokens"])
                    state["cancelled"] = True
                else:
                    state["c"], state["op"], state["tokens"], state["cancelled"] = ctl(), op, 0, False
                    state["weights"] = req.get("weights", state["weights"])
                    log("request", op=op)
                    if op == "load":
                        log("load", weights=req.get("weights"), device=req.get("device"), gpu=req.get("gpu"),
                            cuda_visible=os.environ.get("CUDA_VISIBLE_DEVICES"), nice=os.nice(0))
                c = state["c"]
            if op == "load" and c.get("crash_on_load"):
                kill_child_and(die, int(c.get("exit_code", 3)))
            child.stdin.write(raw if raw.endswith(b"\n") else raw + b"\n")
            child.stdin.flush()
        child.stdin.close()

    threading.Thread(target=pump_in, daemon=True).start()
    for raw in child.stdout:
        obj = json.loads(raw)
        with lock:
            c, cancelled = state["c"], state["cancelled"]
            if "token" in obj:
                state["tokens"] += 1
            k = state["tokens"]
        if "token" in obj:
            if c.get("crash_after") is not None and k > c["crash_after"]:
                kill_child_and(die, int(c.get("exit_code", 3)))
            if c.get("hang_after") is not None and k > c["hang_after"]:
                hang()
            if c.get("delay_s") and not cancelled:
                time.sleep(float(c["delay_s"]))
        elif obj.get("op") == "load" and obj.get("ok"):
            rb = resident_override(c, state["weights"])
            if rb is not None:
                obj["resident_bytes"] = rb
        if "ok" in obj:
            log("final", op=obj.get("op"), tokens=k, cancelled=obj.get("cancelled"))
        out(obj)
    die(child.wait())


if __name__ == "__main__":
    log("start", cuda_visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
        openblas=os.environ.get("OPENBLAS_NUM_THREADS"), argv=sys.argv[1:])
    if sys.argv[1:] != ["--infer"]:
        sys.stderr.write("infer_worker.py: expected --infer\n")
        sys.exit(2)
    if REAL:
        proxy()
    else:
        Fake(Stdin()).run()
