#!/usr/bin/python3
"""bench/loss_torch.py — PyTorch's side of bench_loss, on GPU 0, fp32: the cross entropy of
[rows, vocab] logits with its gradient (F.cross_entropy, then backward of the mean: the
loss and dlogits, as ddpd's op computes both), and torch.nn.utils.clip_grad_norm_(max_norm
1) over the gradients of bench_gpu_step's GPT (the module tree of
tests/pylib/torch_models.py). Each timed between two synchronisations after a warm-up.
Prints two JSON lines like bench_loss's: {"bench":"cross_entropy","rows","vocab","device",
"variant":"torch","ms","gb_per_s","loss"} and {"bench":"clip_norm","model","tensors",
"params","device","variant":"torch","ms","norm"}.

  bench/loss_torch.py [--rows R] [--vocab V] [--model gpt2s|gptmini] [--iters N]"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_step_torch import GPTS, gpt_layers  # noqa: E402


def timed(fn, iters):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        out = fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--model", choices=tuple(GPTS), default="gpt2s")
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.manual_seed(1)

    logits = (2 * torch.randn(a.rows, a.vocab, device=dev)).requires_grad_()
    labels = torch.randint(0, a.vocab, (a.rows,), device=dev)

    def ce():
        logits.grad = None
        loss = F.cross_entropy(logits, labels)
        loss.backward()
        return loss

    dt, loss = timed(ce, a.iters)
    n = a.rows * a.vocab
    print(json.dumps({"bench": "cross_entropy", "rows": a.rows, "vocab": a.vocab, "device": "cuda",
                      "variant": "torch", "ms": dt * 1e3, "gb_per_s": 4.0 * n * 4 / dt / 1e9,
                      "loss": float(loss)}))
    del logits, labels

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from pylib import torch_models

    blocks, dim, heads, t, vocab, _ = GPTS[a.model]
    model = torch_models.build(gpt_layers(blocks, dim, heads, t, vocab)).to(dev)
    params = list(model.parameters())
    for p in params:
        p.grad = 0.01 * torch.randn_like(p)
    dt, norm = timed(lambda: torch.nn.utils.clip_grad_norm_(params, 1.0), a.iters)
    print(json.dumps({"bench": "clip_norm", "model": a.model, "tensors": len(params),
                      "params": sum(p.numel() for p in params), "device": "cuda", "variant": "torch",
                      "ms": dt * 1e3, "norm": float(norm)}))


if __name__ == "__main__":
    main()
