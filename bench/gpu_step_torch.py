#!/usr/bin/python3
"""bench/gpu_step_torch.py — PyTorch's side of bench_gpu_step: the same step (batch copied
from host memory, forward, MSE loss, backward, SGD update) in eager mode, the model wrapped
in DistributedDataParallel at world size 1 over NCCL, on GPU 0. Prints one JSON line like
bench_gpu_step: {"model", "device", "batch", "params", "step_ms"}.

  bench/gpu_step_torch.py --model tiny|mlp [--steps N] [--warmup N]"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn


def build(name):
    if name == "tiny":
        return nn.Linear(10, 5), 3, 10, 5
    model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                          nn.Linear(4096, 10))
    return model, 512, 4096, 10


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("tiny", "mlp"), default="tiny")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=20)
    a = ap.parse_args()
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
