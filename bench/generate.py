#!/usr/bin/python3
"""bench/generate.py — inference from a job's model (issue 29), ddpd vs PyTorch 1.13 eager on
the same weights, one thread each (OPENBLAS_NUM_THREADS=1, torch.set_num_threads(1)):

  bench/generate.py --build build             # 5 interleaved rounds (~1 minute)
  bench/generate.py --build build --quick     # 3 short rounds: a smoke check
  bench/generate.py --build build --check     # exit 1 when a goal is missed

1. Generation: a GPT of 4 blocks (dim 128, 4 heads), T 64, vocab 256, random weights.
   ddpd: `ddpd-worker --infer` (pylib.infer.Worker), a 1-token prompt, 63 greedy new tokens
   (the window, all from the KV cache), streamed; its per-token latency is the final line's
   `seconds` / 63 (the worker's own time, its stream lines written and flushed included: a
   reader's arrival times measure the reader once it falls behind). PyTorch: a KV-cache
   decoder written here (nanoGPT's blocks with keys and values kept per layer, the last
   position alone through the final layernorm and head), under inference_mode, timed the
   same way (prompt to last token) / 63 in this process. Goal: ddpd's per-token latency <= 0.5 of PyTorch's. Both
   decoders must give the same tokens. Also tokens/s, and the worker's time to the first
   token of a request whose model is loaded (send to first line).
2. predict: the digits conv net (examples/digits-cnn.json, BatchNorm with random running
   statistics) on a batch of 256 random 1x8x8 images from an .npy file: the answer's
   `seconds` (reading the file and the eval-mode forward) vs PyTorch eager's forward under
   no_grad. Goal <= 0.6.
3. Memory: the worker's resident set (VmRSS) grown since it started, after loading the GPT
   and after a full-window generation, against the model's parameter bytes plus its KV
   cache (the load answer's param_bytes and cache_bytes). Goal <= 1.2. Also its anonymous
   part (RssAnon: what the model holds; the rest is shared library code paged in).

4. Through the server: `ddpd serve` (one inference process, `--infer-procs 1`) with a
   1-step job of the same GPT, and POST /v1/jobs/{id}/generate with stream:true and a
   1-token prompt, timed from the request's send to its first token line (Python's
   `requests` on the client side included): the first request, which starts the inference
   process and loads the model (goal <= 50 ms), then requests whose model is loaded (median;
   goal <= 2 ms).

Rounds interleave ddpd and PyTorch so that drifts of the machine hit both; the ratio is
taken per round and its median printed. See bench/README.md."""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

for _k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_k] = "1"

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the tests' helper package, tests/pylib
from pylib import infer as I  # noqa: E402
from pylib import torch_models  # noqa: E402
from pylib.safetensors import st_save  # noqa: E402

BLOCKS, DIM, HEADS, T, VOCAB = 4, 128, 4, 64, 256
GOALS = {"generate": 0.5, "predict": 0.6, "memory": 1.2}
TTFT_GOALS_MS = {"loads": 50.0, "loaded": 2.0}


def gpt_model():
    m = [{"type": "embedding", "num": VOCAB, "dim": DIM}, {"type": "position", "max": T, "dim": DIM}]
    for _ in range(BLOCKS):
        m.append({"type": "residual", "layers": [{"type": "layernorm", "dim": DIM},
                                                 {"type": "attention", "dim": DIM, "heads": HEADS}]})
        m.append({"type": "residual", "layers": [{"type": "layernorm", "dim": DIM},
                                                 {"type": "linear", "in": DIM, "out": 4 * DIM},
                                                 {"type": "gelu", "approximate": "tanh"},
                                                 {"type": "linear", "in": 4 * DIM, "out": DIM}]})
    return m + [{"type": "layernorm", "dim": DIM}, {"type": "linear", "in": DIM, "out": VOCAB}]


def spec_of(model, input_shape, data):
    return {"name": "bench-generate", "device": "cpu", "model": model, "input_shape": input_shape,
            "loss": "cross_entropy", "optimizer": {"type": "sgd", "lr": 0.1}, "batch_size": 1, "steps": 1,
            "data": data}


# ---------------------------------------------------------------------------------------
# PyTorch eager with a KV cache


class TorchKV:
    """nanoGPT's blocks decoded with a KV cache, on the weights of the spec's tree."""

    def __init__(self, sd):
        import torch
        self.torch = torch
        self.F = torch.nn.functional
        self.w = {k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in sd.items()}
        self.hd = DIM // HEADS
        self.scale = 1.0 / (self.hd ** 0.5)

    def reset(self):
        z = self.torch.zeros
        self.k = [z(HEADS, T, self.hd) for _ in range(BLOCKS)]
        self.v = [z(HEADS, T, self.hd) for _ in range(BLOCKS)]
        self.pos = 0

    def forward(self, ids):
        """Logits of the token after `ids`, which go at positions pos .. pos+n-1."""
        F, w, n, p = self.F, self.w, len(ids), self.pos
        x = w["0.weight"][ids] + w["1.weight"][p:p + n]
        for b in range(BLOCKS):
            a, m = 2 + 2 * b, 3 + 2 * b
            h = F.layer_norm(x, (DIM,), w[f"{a}.0.weight"], w[f"{a}.0.bias"], 1e-5)
            q, k, v = F.linear(h, w[f"{a}.1.qkv.weight"], w[f"{a}.1.qkv.bias"]).split(DIM, dim=1)
            q = q.view(n, HEADS, self.hd).transpose(0, 1)
            self.k[b][:, p:p + n] = k.view(n, HEADS, self.hd).transpose(0, 1)
            self.v[b][:, p:p + n] = v.view(n, HEADS, self.hd).transpose(0, 1)
            att = (q @ self.k[b][:, :p + n].transpose(-2, -1)) * self.scale
            if n > 1:
                mask = self.torch.ones(n, p + n, dtype=self.torch.bool).tril(p)
                att = att.masked_fill(~mask, float("-inf"))
            y = (att.softmax(-1) @ self.v[b][:, :p + n]).transpose(0, 1).reshape(n, DIM)
            x = x + F.linear(y, w[f"{a}.1.proj.weight"], w[f"{a}.1.proj.bias"])
            h = F.layer_norm(x, (DIM,), w[f"{m}.0.weight"], w[f"{m}.0.bias"], 1e-5)
            h = F.gelu(F.linear(h, w[f"{m}.1.weight"], w[f"{m}.1.bias"]), approximate="tanh")
            x = x + F.linear(h, w[f"{m}.3.weight"], w[f"{m}.3.bias"])
        f = 2 + 2 * BLOCKS
        x = F.layer_norm(x[-1:], (DIM,), w[f"{f}.weight"], w[f"{f}.bias"], 1e-5)
        self.pos += n
        return F.linear(x, w[f"{f + 1}.weight"], w[f"{f + 1}.bias"])[0]

    def generate(self, prompt, n):
        """(tokens, seconds) of greedy decoding: the prompt's forward, then a token at a time."""
        with self.torch.inference_mode():
            t0 = time.perf_counter()
            self.reset()
            out = []
            logits = self.forward(list(prompt))
            for i in range(n):
                t = int(self.torch.argmax(logits))
                out.append(t)
                if i + 1 < n:
                    logits = self.forward([t])
            return out, time.perf_counter() - t0


# ---------------------------------------------------------------------------------------
# ddpd


def ddpd_generate(worker, prompt, n):
    """(tokens, the worker's seconds, time to the first token line over the pipe)."""
    t0 = time.perf_counter()
    worker.send({"op": "generate", "ids": list(prompt), "max_new_tokens": n, "temperature": 0, "stream": True})
    first, toks = None, []
    while True:
        o = worker.line()
        if first is None:
            first = time.perf_counter() - t0
        if "ok" in o:
            assert o["ok"], o
            return toks, o["seconds"], first
        toks.append(o["token"])


def rss(pid, key="VmRSS"):
    for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
        if ln.startswith(key + ":"):
            return int(ln.split()[1]) * 1024
    raise RuntimeError("no " + key)


def median_ratio(a, b):
    return statistics.median(x / y for x, y in zip(a, b))


def server_ttft(root, spec, requests_n):
    """(first, loaded): seconds from a streamed generate's send to its first token line
    through `ddpd serve`, for the request that starts and loads the model and (median) for
    `requests_n` requests whose model is loaded."""
    import requests
    from pylib.server import Server
    srv = Server(root / "srv", cpu_slots=1, extra=["--infer-procs", "1"])
    srv.start()
    try:
        ids = (np.arange(4 * T + 1) % VOCAB).astype(np.uint16)
        ids.tofile(srv.data_dir / "t.bin")
        jid = srv.submit(dict(spec, name="bench-ttft"))["id"]
        j = srv.wait_state(jid, ("succeeded", "failed", "cancelled"), timeout=300)
        assert j["state"] == "succeeded", j

        def one():
            t0 = time.perf_counter()
            with requests.post(f"{srv.url}/v1/jobs/{jid}/generate", stream=True, timeout=60,
                               json={"ids": [1], "max_new_tokens": 1, "temperature": 0, "stream": True}) as r:
                assert r.status_code == 200, r.text
                for ln in r.iter_lines():
                    if ln.strip():
                        first = time.perf_counter() - t0
                        assert "token" in json.loads(ln), ln
                        break
                for _ in r.iter_lines():
                    pass
            return first

        first = one()
        loaded = statistics.median(one() for _ in range(requests_n))
        return first, loaded
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    rounds = args.rounds or (3 if args.quick else 5)
    os.environ["DDPD_BIN"] = str(Path(args.build).resolve())
    import torch
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="bench-generate-"))

    # The weights, once, for both sides.
    model = gpt_model()
    sd = torch_models.init_state(model, 1)
    st_save(root / "gpt.safetensors", sd)
    gspec = spec_of(model, [T], {"type": "tokens", "path": "t.bin", "block_size": T})
    cnn = json.loads((REPO / "examples" / "digits-cnn.json").read_text())["model"]
    csd = torch_models.init_state(cnn, 2)
    rng = np.random.default_rng(3)
    for k in list(csd):
        if k.endswith("running_mean"):
            csd[k] = rng.normal(0, 0.5, csd[k].shape).astype(np.float32)
        elif k.endswith("running_var"):
            csd[k] = rng.uniform(0.5, 2.0, csd[k].shape).astype(np.float32)
    st_save(root / "cnn.safetensors", csd)
    cspec = spec_of(cnn, [1, 8, 8], {"type": "npy", "x": "x.npy", "y": "y.npy"})
    x = rng.normal(size=(256, 1, 8, 8)).astype(np.float32)
    np.save(root / "x.npy", x)

    # Memory first, in a fresh worker: what load and a full window add to its resident set.
    w = I.Worker(log=root / "memory.log")
    w.ok({"op": "unload"})  # started and answering: its baseline
    base, base_anon = rss(w.p.pid), rss(w.p.pid, "RssAnon")
    ans = w.ok({"op": "load", "spec": gspec, "weights": str(root / "gpt.safetensors"), "device": "cpu",
                "max_batch": 1})[1]
    held = ans["param_bytes"] + ans["cache_bytes"]
    after_load, anon_load = rss(w.p.pid) - base, rss(w.p.pid, "RssAnon") - base_anon
    ddpd_generate(w, [1], T - 1)
    after_gen, anon_gen = rss(w.p.pid) - base, rss(w.p.pid, "RssAnon") - base_anon
    w.close()

    w = I.Worker(log=root / "worker.log")
    kv = TorchKV(sd)
    tcnn = torch_models.build(cnn)
    tcnn.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in csd.items()}, strict=True)
    tcnn.eval()
    xt = torch.from_numpy(x)
    n = T - 1
    prompt = [72]
    gen_d, gen_t, ttft, pred_d, pred_t = [], [], [], [], []
    w.ok({"op": "load", "spec": gspec, "weights": str(root / "gpt.safetensors"), "device": "cpu"})
    same = None
    for r in range(rounds + 1):  # round 0 warms both up
        ds, ts = [], []
        for _ in range(5):
            toks, secs, first = ddpd_generate(w, prompt, n)
            ds.append(secs / n)
            ttok, tsecs = kv.generate(prompt, n)
            ts.append(tsecs / n)
            same = toks == ttok
        if r:
            gen_d.append(statistics.median(ds))
            gen_t.append(statistics.median(ts))
            ttft.append(first)
    w.ok({"op": "load", "spec": cspec, "weights": str(root / "cnn.safetensors"), "device": "cpu", "max_batch": 256})
    for r in range(rounds + 1):
        ds = []
        for _ in range(5):
            ds.append(w.ok({"op": "predict", "npy": str(root / "x.npy")})[1]["seconds"])
        ts = []
        with torch.no_grad():
            for _ in range(5):
                t0 = time.perf_counter()
                tcnn(xt)
                ts.append(time.perf_counter() - t0)
        if r:
            pred_d.append(statistics.median(ds))
            pred_t.append(statistics.median(ts))
    w.close()

    first, loaded = server_ttft(root, gspec, 5 * rounds)

    ok = True

    def line(name, ratio, goal, detail):
        nonlocal ok
        good = ratio <= goal
        ok &= good
        print(f"{name:<26} ratio {ratio:.3f} (goal <= {goal}) {'ok' if good else 'MISSED'}   {detail}")

    gd, gt = statistics.median(gen_d), statistics.median(gen_t)
    print(f"# bench/generate.py: {rounds} rounds, ddpd {os.environ['DDPD_BIN']}, torch {torch.__version__}, 1 thread")
    line("generate per token", median_ratio(gen_d, gen_t), GOALS["generate"],
         f"ddpd {gd * 1e6:.1f} us ({1 / gd:.0f} tokens/s)  torch KV {gt * 1e6:.1f} us ({1 / gt:.0f} tokens/s)"
         f"  same tokens: {same}")
    print(f"{'':<26} ddpd time to the first token line (model loaded, 1-token prompt, over the pipe): "
          f"{statistics.median(ttft) * 1e3:.2f} ms")
    pd, pt = statistics.median(pred_d), statistics.median(pred_t)
    line("predict digits CNN b256", median_ratio(pred_d, pred_t), GOALS["predict"],
         f"ddpd {pd * 1e3:.2f} ms  torch {pt * 1e3:.2f} ms (eager, no_grad)")
    for name, got in (("loads", first), ("loaded", loaded)):
        good = got * 1e3 <= TTFT_GOALS_MS[name]
        ok &= good
        print(f"{'first token, ' + ('model loaded' if name == 'loaded' else 'loading it'):<26} "
              f"{got * 1e3:.2f} ms (goal <= {TTFT_GOALS_MS[name]:.0f} ms) {'ok' if good else 'MISSED'}   "
              f"through ddpd serve, POST generate stream:true, send to first token line")
    line("memory after load", after_load / held, GOALS["memory"],
         f"RSS +{after_load / 2**20:.2f} MiB (anonymous +{anon_load / 2**20:.2f} MiB, {anon_load / held:.3f}) vs "
         f"params {ans['param_bytes'] / 2**20:.2f} MiB + cache {ans['cache_bytes'] / 2**20:.2f} MiB")
    line("memory after a window", after_gen / held, GOALS["memory"],
         f"RSS +{after_gen / 2**20:.2f} MiB (anonymous +{anon_gen / 2**20:.2f} MiB, {anon_gen / held:.3f})")
    if not same:
        print("WARNING: ddpd's and PyTorch's greedy tokens differ")
    if args.keep:
        print(f"kept {root}")
    else:
        import shutil
        shutil.rmtree(root, ignore_errors=True)
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
