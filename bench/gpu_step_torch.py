#!/usr/bin/python3
"""bench/gpu_step_torch.py — PyTorch's side of bench_gpu_step: the same step (batch copied
from host memory, forward, loss, backward, update) in eager mode, fp32 with TF32 off, on
GPU 0. tiny and mlp: MSE and SGD, the model wrapped in DistributedDataParallel at world
size 1 over NCCL. gpt2s and gptmini: the GPT of bench_gpu_step (the module tree of
tests/pylib/torch_models.py; int64 token ids, cross entropy over the B·T positions, AdamW),
plain eager without DDP, as ddpd's side runs one rank without it. Prints one JSON line like
bench_gpu_step: {"model", "device", "batch", "params", "step_ms", "tokens_per_s" (GPTs)}.

  bench/gpu_step_torch.py --model tiny|mlp|gpt2s|gptmini [--steps N] [--warmup N]"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


# bench_gpu_step's GPT shapes: blocks, dim, heads, T, vocab, batch.
GPTS = {"gpt2s": (12, 768, 12, 1024, 50304, 4), "gptmini": (2, 64, 4, 32, 256, 2)}


def gpt_layers(blocks, dim, heads, t, vocab):
    lin = lambda i, o: {"type": "linear", "in": i, "out": o}  # noqa: E731
    model = [{"type": "embedding", "num": vocab, "dim": dim}, {"type": "position", "max": t, "dim": dim}]
    for _ in range(blocks):
        model.append({"type": "residual", "layers": [{"type": "layernorm", "dim": dim},
                                                     {"type": "attention", "dim": dim, "heads": heads}]})
        model.append({"type": "residual", "layers": [{"type": "layernorm", "dim": dim}, lin(dim, 4 * dim),
                                                     {"type": "gelu", "approximate": "tanh"}, lin(4 * dim, dim)]})
    return model + [{"type": "layernorm", "dim": dim}, lin(dim, vocab)]


def gpt_main(a):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from pylib import torch_models

    blocks, dim, heads, t, vocab, batch = GPTS[a.model]
    steps = a.steps or (20 if a.model == "gpt2s" else 50)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.manual_seed(1)
    model = torch_models.build(gpt_layers(blocks, dim, heads, t, vocab)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    ce = nn.CrossEntropyLoss()
    hx = torch.randint(0, vocab, (batch, t))
    hy = torch.randint(0, vocab, (batch, t))

    def step():
        x, y = hx.to(dev), hy.to(dev)
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = ce(out.reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    for _ in range(a.warmup if a.warmup is not None else 3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"model": a.model, "device": "cuda", "batch": batch, "params": params,
                      "step_ms": dt * 1e3, "tokens_per_s": batch * t / dt, "loss": float(loss),
                      "peak_mem_gib": torch.cuda.max_memory_allocated(dev) / 2**30}))


def build(name):
    if name == "tiny":
        return nn.Linear(10, 5), 3, 10, 5
    model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                          nn.Linear(4096, 10))
    return model, 512, 4096, 10


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("tiny", "mlp") + tuple(GPTS), default="tiny")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=None, help="default 20 (GPTs: 3)")
    a = ap.parse_args()
    if a.model in GPTS:
        return gpt_main(a)
    if a.warmup is None:
        a.warmup = 20
    steps = a.steps or (2000 if a.model == "tiny" else 50)

    # Exact float32, as ddpd's default precision.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("nccl", rank=0, world_size=1)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.manual_seed(1)
    model, batch, n_in, n_out = build(a.model)
    model = nn.parallel.DistributedDataParallel(model.to(dev), device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    hx, hy = torch.randn(batch, n_in), torch.randn(batch, n_out)

    def step():
        x, y = hx.to(dev), hy.to(dev)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"model": a.model, "device": "cuda", "batch": batch, "params": params,
                      "step_ms": dt * 1e3, "loss": float(loss)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
