"""ddp.py — shared helpers of the multi-rank tests (tests/parity/test_ddp.py,
tests/e2e/test_ddp_faults.py): a small safetensors reader/writer (numpy + json), data
layout for `ddpd run --world-size W` (one sharded file, or per-rank `{rank}` files),
running `ddpd run` with W ranks and splitting its events by rank, a reference run of the
same job with real PyTorch 1.13 DistributedDataParallel (gloo, CPU, one process per
rank), a float64 simulator of DDP.md §4 for the 1-d model `Linear(1,1,bias=False)`, and
comparisons with the parity tolerances (losses 1e-5 relative with a 1e-7 floor, weights
1e-5 + 1e-5·|ref|).

The PyTorch side runs one forked child per rank (torch is imported once, in the test
process; `cd tests && /usr/bin/python3 -m pylib.ddp rank CFG RANK PORT` runs one rank by hand): each
reads the case (a pickle) and writes res-RANK.pkl with that rank's per-step losses, the
steps at which it joined, and its final state_dict and optimizer state.

Environment: DDPD_BIN = folder holding `ddpd` and `ddpd-worker` (default <repo>/build);
DDPD_TEST_TMP = where temporary folders go (default: the system temp dir).
"""
import contextlib
import json
import math
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from pylib import safetensors as _st
from pylib.common import (REPO, bin_dir, device_env, device_spec, install_skip_code,  # noqa: F401
                          make_workdir, on_emulated_gpu)
from pylib.parity import init_weights, make_xy  # noqa: F401 (the same draws for one rank and many)

TORCH_PYTHON = "/usr/bin/python3"

LOSS_RTOL = 1e-5
LOSS_ATOL = 1e-7
W_RTOL = 1e-5
W_ATOL = 1e-5

# ---------------------------------------------------------------------------------------
# binaries and folders


def need_bin():
    import pytest
    d = bin_dir()
    if d is None:
        pytest.skip("ddpd is not built (set DDPD_BIN to the build folder)")
    return d


def need_torch():
    """Skips the test unless PyTorch (with torch.distributed/gloo) imports here."""
    import pytest
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    return torch


def workdir(prefix):
    return make_workdir(prefix)


def env1():
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


# ---------------------------------------------------------------------------------------
# safetensors (CONTRACT.md §4)

def st_save(path, tensors):
    _st.st_save(path, tensors)


def st_load(path):
    """The tensors of a safetensors file (name -> array), its metadata dropped."""
    return _st.st_load(path, strict=False)[0]


# ---------------------------------------------------------------------------------------
# models, initial weights, data


def mlp(*widths, act="relu", bias=True):
    """[linear, act, linear, ...] for widths (in, h1, ..., out)."""
    layers = []
    for i in range(len(widths) - 1):
        if i:
            layers.append({"type": act})
        layers.append({"type": "linear", "in": widths[i], "out": widths[i + 1], "bias": bias})
    return layers


class Case:
    """One multi-rank job: the spec and each rank's samples (x_r, y_r) in the order that
    rank sees them (shuffle false).

    layout "sharded": one file x.npy/y.npy holding all samples; rank r takes r, r+W, ...
    layout "rank": files x_{rank}.npy / y_{rank}.npy, one per rank, taken whole."""

    def __init__(self, spec, world, xs, ys, init_sd, layout):
        self.spec = spec
        self.world = world
        self.xs = xs
        self.ys = ys
        self.init_sd = init_sd
        self.layout = layout

    @classmethod
    def sharded(cls, spec, world, x, y, init_sd):
        xs = [x[r::world] for r in range(world)]
        ys = [y[r::world] for r in range(world)]
        c = cls(spec, world, xs, ys, init_sd, "sharded")
        c.full = (x, y)
        return c

    @classmethod
    def per_rank(cls, spec, xs, ys, init_sd):
        return cls(spec, len(xs), list(xs), list(ys), init_sd, "rank")

    def batch_counts(self):
        bs = self.spec["batch_size"]
        drop = self.spec["data"].get("drop_last", False) if "data" in self.spec else False
        return [len(x) // bs if drop else -(-len(x) // bs) for x in self.xs]

    def steps_per_epoch(self):
        k = self.spec.get("grad_accum", 1)
        return [-(-n // k) for n in self.batch_counts()]

    def write(self, data_dir):
        """Writes the data files and init.safetensors into data_dir and completes the
        spec (data, init, world_size). Returns the spec."""
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        spec = json.loads(json.dumps(self.spec))
        extra = spec.pop("data", {})
        if self.layout == "sharded":
            x, y = self.full
            np.save(data_dir / "x.npy", x)
            np.save(data_dir / "y.npy", y)
            spec["data"] = dict({"type": "npy", "x": "x.npy", "y": "y.npy", "shuffle": False}, **extra)
        else:
            for r in range(self.world):
                np.save(data_dir / f"x_{r}.npy", self.xs[r])
                np.save(data_dir / f"y_{r}.npy", self.ys[r])
            spec["data"] = dict({"type": "npy", "x": "x_{rank}.npy", "y": "y_{rank}.npy", "shuffle": False}, **extra)
        st_save(data_dir / "init.safetensors", self.init_sd)
        spec["init"] = {"from": "init.safetensors"}
        spec["world_size"] = self.world
        spec.setdefault("device", "cpu")
        spec.setdefault("log_every", 1)
        return spec


# ---------------------------------------------------------------------------------------
# running ddpd


class Run:
    """A finished `ddpd run`: exit code, stdout events, stderr, out folder."""

    def __init__(self, rc, stdout, stderr, out, cmd):
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        self.out = Path(out)
        self.cmd = cmd
        self.events = []
        self.bad_lines = []
        for ln in stdout.splitlines():
            if not ln.strip():
                continue
            try:
                ev = json.loads(ln)
            except ValueError:
                self.bad_lines.append(ln)
                continue
            (self.events if isinstance(ev, dict) else self.bad_lines).append(ev)

    def of(self, kind, rank=None):
        return [e for e in self.events if e.get("event") == kind and (rank is None or e.get("rank") == rank)]

    def losses(self):
        """{rank: {step: loss}} of every loss event."""
        out = {}
        for e in self.of("loss"):
            out.setdefault(int(e["rank"]), {})[int(e["step"])] = e["loss"]
        return out

    def log(self, rank):
        p = self.out / f"rank-{rank}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def describe(self):
        logs = "".join(f"--- rank-{r}.log (tail) ---\n{self.log(r)[-1500:]}\n"
                       for r in range(8) if (self.out / f"rank-{r}.log").exists())
        return (f"$ {' '.join(map(str, self.cmd))}\nexit {self.rc}\n--- stdout (tail) ---\n"
                f"{self.stdout[-3000:]}\n--- stderr (tail) ---\n{self.stderr[-3000:]}\n{logs}")

    def check_ok(self, world):
        assert self.rc == 0, "ddpd run failed\n" + self.describe()
        assert not self.bad_lines, f"non-JSON lines on stdout: {self.bad_lines[:5]}"
        done = sorted(e["rank"] for e in self.of("done"))
        assert done == list(range(world)), f"done events from ranks {done}, want 0..{world - 1}\n" + self.describe()
        assert not self.of("error"), f"error events: {self.of('error')}"
        return self

    def model(self):
        p = self.out / "model.safetensors"
        assert p.exists(), f"no {p}\n" + self.describe()
        return st_load(p)


def ddpd_cmd(world, spec_path, out, data_dir, extra=()):
    d = need_bin()
    return [str(d / "ddpd"), "run", "--world-size", str(world), "--out", str(out),
            "--data-dir", str(data_dir), *extra, str(spec_path)]


def run_ddpd(spec, world, work, name="run", timeout=120, extra=()):
    """Writes the spec (as the parity device runs it: pylib.common.device_spec) to
    WORK/NAME.spec.json and runs `ddpd run --world-size W --out WORK/NAME --data-dir
    WORK/data`."""
    work = Path(work)
    spec_path = work / f"{name}.spec.json"
    spec_path.write_text(json.dumps(device_spec(spec, world), indent=1))
    out = work / name
    cmd = ddpd_cmd(world, spec_path, out, work / "data", extra)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=device_env(env1(), world), cwd=str(work))
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"ddpd run timed out after {timeout}s: {' '.join(cmd)}\n"
                             f"stdout: {(e.stdout or b'')[-2000:]!r}\nstderr: {(e.stderr or b'')[-2000:]!r}")
    return Run(p.returncode, p.stdout, p.stderr, out, cmd)


# ---------------------------------------------------------------------------------------
# the PyTorch DDP reference (one process per rank)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_ddp(case, work, timeout=120):
    """Runs the case with real PyTorch DDP. Returns a list (per rank) of dicts:
    losses {step: loss}, joins [step], state {name: array}, optim {name: array}."""
    work = Path(work)
    ref = work / "torch"
    ref.mkdir(parents=True, exist_ok=True)
    spec = case.spec
    cfg = {
        "world": case.world, "model": spec["model"], "loss": spec["loss"], "optimizer": spec["optimizer"],
        "batch_size": spec["batch_size"], "drop_last": spec.get("data", {}).get("drop_last", False),
        "epochs": spec.get("epochs", 1), "grad_accum": spec.get("grad_accum", 1),
        "join": _join_on(spec, case), "divide": spec.get("ddp", {}).get("divide_by_initial_world_size", True),
        "bucket_cap_mb": spec.get("ddp", {}).get("bucket_cap_mb", 25),
        "comm_hook": spec.get("ddp", {}).get("comm_hook", "none"),
        "xs": case.xs, "ys": case.ys, "init": case.init_sd, "max_steps": max(case.steps_per_epoch()),
        "grad_clip": spec.get("grad_clip", 0), "snapshots": bool(spec.get("eval")),
    }
    cfg_path = ref / "case.pkl"
    cfg_path.write_bytes(pickle.dumps(cfg))
    last = None
    for _attempt in range(3):
        port = free_port()
        for r in range(case.world):
            (ref / f"res-{r}.pkl").unlink(missing_ok=True)
        codes, outs = _fork_ranks(cfg_path, case.world, port, ref, timeout)
        if all(c == 0 for c in codes):
            return [pickle.loads((ref / f"res-{r}.pkl").read_bytes()) for r in range(case.world)]
        last = "\n".join(f"--- torch rank {r} (exit {c}) ---\n{o[-3000:]}" for r, (c, o) in enumerate(zip(codes, outs)))
        if "Address already in use" not in last and "EADDRINUSE" not in last:
            break
    raise AssertionError("the PyTorch DDP reference failed\n" + last)


def _fork_ranks(cfg_path, world, port, ref, timeout):
    """Runs _torch_rank for every rank in a child process. Forks this process (torch is
    imported once, here) when it may; else starts `python3 -m pylib.ddp rank ...`.
    Returns (exit codes, outputs)."""
    import torch  # noqa: F401  (imported before forking, once)
    torch.set_num_threads(1)
    logs = [ref / f"rank-{r}.out" for r in range(world)]
    pids = []
    for r in range(world):
        pid = os.fork()
        if pid == 0:  # child: never return into the caller
            code = 1
            try:
                fd = os.open(str(logs[r]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                _torch_rank(cfg_path, r, port)
                code = 0
            except BaseException:
                import traceback
                traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        pids.append(pid)
    codes = [None] * world
    deadline = time.monotonic() + timeout
    while any(c is None for c in codes):
        for i, pid in enumerate(pids):
            if codes[i] is None:
                got, st = os.waitpid(pid, os.WNOHANG)
                if got:
                    codes[i] = os.waitstatus_to_exitcode(st)
        if time.monotonic() > deadline:
            for i, pid in enumerate(pids):
                if codes[i] is None:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    codes[i] = "timeout"
        time.sleep(0.01)
    outs = [l.read_text(errors="replace") if l.exists() else "" for l in logs]
    return codes, outs


def _join_on(spec, case):
    j = spec.get("ddp", {}).get("join", "auto")
    if j == "auto":
        return len(set(case.batch_counts())) > 1
    return bool(j)


def schedule_lr(o, step, job_steps):
    """The lr at optimizer step `step` (from 1) of CONTRACT.md §2a's optimizer.schedule,
    as a factor of o["lr"] (what a LambdaLR lambda returns)."""
    sc = o.get("schedule") or {}
    lr, m = o["lr"], sc.get("min_lr", 0.0)
    w = sc.get("warmup_steps", 0)
    total = sc.get("total_steps", 0) or job_steps
    if step <= w:
        return step / w
    p = min(1.0, (step - w) / (total - w)) if total > w else 1.0
    kind = sc.get("type", "constant")
    if kind == "linear":
        return (lr + (m - lr) * p) / lr
    if kind == "cosine":
        return (m + (lr - m) * (1 + math.cos(math.pi * p)) / 2) / lr
    return 1.0


def bf16_ring_sum(parts):
    """The sum of W bfloat16 tensors of n elements as gloo's ring all-reduce would make it if
    it took bfloat16 (it takes fp16 only, in 1.13): chunk g of 2W segments of ceil(n/2W)
    elements is summed from rank g-1 down to rank g, every add rounded to bfloat16 (torch's
    bf16 add on the CPU: in float, rounded to nearest even). The same order is fp16's, which
    gloo really does (checked against it, W = 2, 3, 4)."""
    import torch
    W, n = len(parts), parts[0].numel()
    per = 2 * (-(-n // (2 * W)))
    out = torch.empty_like(parts[0])
    for g in range(W):
        lo, hi = min(g * per, n), min((g + 1) * per, n)
        if lo == hi:
            continue
        acc = parts[(g - 1) % W][lo:hi].clone()
        for k in range(2, W + 1):
            acc = acc + parts[(g - k) % W][lo:hi]
        out[lo:hi] = acc
    return out


def bf16_hook_gloo(process_group, bucket):
    """bf16_compress_hook as PyTorch 1.13 writes it (cast to bfloat16, div_ by the world size
    in bfloat16, all-reduce SUM in bfloat16, copy back into the float bucket), with the
    all-reduce emulated because gloo has no bfloat16: every rank's bfloat16 values are
    all-gathered (exactly, as floats) and summed in gloo's ring order with bfloat16 rounding
    after each add (bf16_ring_sum). A joined rank runs it on its zero buckets, as PyTorch's
    join hook runs any comm hook, so the all-gathers pair."""
    import torch
    import torch.distributed as dist
    W = dist.get_world_size()
    compressed = bucket.buffer().to(torch.bfloat16).div_(W)
    gathered = [torch.empty(compressed.shape, dtype=torch.float32) for _ in range(W)]
    dist.all_gather(gathered, compressed.float())
    total = bf16_ring_sum([t.to(torch.bfloat16) for t in gathered])
    buf = bucket.buffer()
    buf.copy_(total)
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


def _torch_rank(cfg_path, rank, port):
    """One rank of the PyTorch reference (runs in its own process)."""
    import datetime

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    cfg = pickle.loads(Path(cfg_path).read_bytes())
    W = cfg["world"]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=W,
                            timeout=datetime.timedelta(seconds=60))
    nn = torch.nn
    from pylib import torch_models
    model = torch_models.build(cfg["model"])  # §2a's module tree; nn.Sequential for an MLP
    model.load_state_dict({k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in cfg["init"].items()})
    ddp = DDP(model, bucket_cap_mb=cfg["bucket_cap_mb"])
    if cfg.get("comm_hook", "none") == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif cfg.get("comm_hook", "none") == "bf16":
        ddp.register_comm_hook(None, bf16_hook_gloo)
    o = cfg["optimizer"]
    if o["type"] == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=o["lr"], momentum=o.get("momentum", 0.0),
                              dampening=o.get("dampening", 0.0), weight_decay=o.get("weight_decay", 0.0),
                              nesterov=o.get("nesterov", False))
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=o["lr"], betas=tuple(o.get("betas", (0.9, 0.999))),
                                eps=o.get("eps", 1e-8), weight_decay=o.get("weight_decay", 0.01))
    # optimizer.schedule through LambdaLR: its lambda is the factor of the global step about
    # to run (a joined rank's shadowed steps count too, as ddpd counts them).
    gstep = [1]
    job_steps = cfg["max_steps"] * cfg["epochs"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _e: schedule_lr(o, gstep[0], job_steps))
    loss_fn = nn.MSELoss() if cfg["loss"] == "mse" else nn.CrossEntropyLoss()
    ids = torch_models.uses_ids(cfg["model"])
    X = torch.from_numpy(np.ascontiguousarray(cfg["xs"][rank], dtype=np.int64 if ids else np.float32))
    yv = cfg["ys"][rank]
    if cfg["loss"] == "mse":
        yv = np.asarray(yv, dtype=np.float32)
        if yv.ndim == 1:
            yv = yv[:, None]
    else:
        yv = np.asarray(yv, dtype=np.int64)  # [N] classes, or [N, T] for sequence logits
    Y = torch.from_numpy(np.ascontiguousarray(yv))
    if cfg["loss"] != "mse":  # sequence cross_entropy: the mean over all B·T positions
        ce = loss_fn
        loss_fn = lambda out, y: ce(out.reshape(-1, out.shape[-1]), y.reshape(-1))  # noqa: E731
    n, bs, k = len(X), cfg["batch_size"], cfg["grad_accum"]
    nb = n // bs if cfg["drop_last"] else -(-n // bs)
    batches = [(b * bs, min(n, (b + 1) * bs)) for b in range(nb)]
    groups = [batches[i:i + k] for i in range(0, nb, k)]
    S = cfg["max_steps"]
    losses, joins, lrs, norms, snaps = {}, [], {}, {}, {}
    for epoch in range(cfg["epochs"]):
        ctx = ddp.join(divide_by_initial_world_size=cfg["divide"]) if cfg["join"] else contextlib.nullcontext()
        with ctx:
            for gi, grp in enumerate(groups):
                opt.zero_grad()
                ls = []
                for j, (lo, hi) in enumerate(grp):
                    sync = contextlib.nullcontext() if j == len(grp) - 1 else ddp.no_sync()
                    with sync:
                        loss = loss_fn(ddp(X[lo:hi]), Y[lo:hi])
                        loss.backward()
                    ls.append(loss.item())
                g = epoch * S + gi + 1
                if cfg.get("grad_clip"):
                    norms[g] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"]))
                gstep[0] = g
                with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()"
                    warnings.simplefilter("ignore")
                    sched.step()
                lrs[g] = opt.param_groups[0]["lr"]
                opt.step()
                losses[g] = sum(ls) / len(ls)
                if cfg.get("snapshots"):
                    snaps[g] = {kk: v.detach().numpy().copy() for kk, v in model.state_dict().items()}
            if cfg["join"] and len(groups) < S:
                joins.append(epoch * S + len(groups))
    names = {id(p): nm for nm, p in model.named_parameters()}
    optim = {}
    for p, st in opt.state.items():
        for key, v in st.items():
            if torch.is_tensor(v) and v.numel() == p.numel():
                optim[f"{names[id(p)]}.{key}"] = v.detach().numpy().copy()
    res = {"losses": losses, "joins": joins, "optim": optim, "lr": lrs, "grad_norm": norms, "snapshots": snaps,
           "state": {kk: v.detach().numpy().copy() for kk, v in model.state_dict().items()}}
    dist.barrier()
    dist.destroy_process_group()
    Path(cfg_path).with_name(f"res-{rank}.pkl").write_bytes(pickle.dumps(res))


# ---------------------------------------------------------------------------------------
# a float64 simulator of DDP.md §4 for Linear(1,1,bias=False), mse (w·x − y)², SGD


def simulate_1d(xs, ys, w0, lr, momentum=0.0, divide=True, epochs=1, batch_size=1):
    """Every rank's losses {rank: {step: loss}} and the final weight, following DDP.md
    §4.3–4.5: live ranks average Σ_live g_r / (W or |live|), joined ranks add nothing and
    keep their weight and momentum; at the end of each epoch every rank takes the weight
    of the highest rank with the most batches (momentum buffers stay per rank)."""
    W = len(xs)
    batches = [[(np.asarray(x[i:i + batch_size], np.float64).reshape(-1), np.asarray(y[i:i + batch_size], np.float64).reshape(-1))
                for i in range(0, len(x), batch_size)] for x, y in zip(xs, ys)]
    counts = [len(b) for b in batches]
    nmax = max(counts)
    last = max(r for r in range(W) if counts[r] == nmax)
    w = [float(w0)] * W
    buf = [None] * W
    losses = {r: {} for r in range(W)}
    for e in range(epochs):
        for i in range(nmax):
            live = [r for r in range(W) if i < counts[r]]
            g = {}
            for r in live:
                x, y = batches[r][i]
                res = w[r] * x - y
                losses[r][e * nmax + i + 1] = float(np.mean(res * res))
                g[r] = float(np.mean(2 * res * x))
            G = sum(g.values()) / (W if divide else len(live))
            for r in live:
                if momentum:
                    buf[r] = G if buf[r] is None else momentum * buf[r] + G
                    w[r] -= lr * buf[r]
                else:
                    w[r] -= lr * G
        w = [w[last]] * W
    return losses, w[0]


# ---------------------------------------------------------------------------------------
# comparisons


def compare_losses(got, ref, what="losses", rtol=LOSS_RTOL, atol=LOSS_ATOL):
    """None when {step: loss} dicts agree, else a message naming the first diverging step."""
    if sorted(got) != sorted(ref):
        return (f"{what}: steps differ: ddpd logged {sorted(got)[:12]}{'...' if len(got) > 12 else ''}, "
                f"reference {sorted(ref)[:12]}{'...' if len(ref) > 12 else ''}")
    first, worst = None, (0.0, None)
    for s in sorted(ref):
        g, r = got[s], ref[s]
        if g is None:
            return f"{what}: step {s}: ddpd loss is null (nonfinite), reference {r!r}"
        err = abs(g - r)
        if err > max(rtol * abs(r), atol) and first is None:
            first = (s, g, r, err)
        rel = err / max(abs(r), 1e-30)
        if rel > worst[0]:
            worst = (rel, s)
    if first is None:
        return None
    s, g, r, err = first
    return (f"{what}: first diverging step {s}: ddpd {g!r} vs reference {r!r} (abs {err:.3g}, rel "
            f"{err / max(abs(r), 1e-30):.3g}); worst rel {worst[0]:.3g} at step {worst[1]}")


def compare_all_losses(got, ref):
    """got: {rank: {step: loss}} from ddpd; ref: list of per-rank reference dicts (or
    {rank: {step: loss}}). None or the messages of every rank that differs."""
    refd = ref if isinstance(ref, dict) else {r: d["losses"] for r, d in enumerate(ref)}
    msgs = []
    for r in sorted(refd):
        m = compare_losses(got.get(r, {}), refd[r], what=f"rank {r} losses")
        if m:
            msgs.append(m)
    extra = sorted(set(got) - set(refd))
    if extra:
        msgs.append(f"loss events from unexpected ranks {extra}")
    return "\n".join(msgs) or None


def compare_tensors(got, ref, what="final weights", rtol=W_RTOL, atol=W_ATOL):
    if sorted(got) != sorted(ref):
        return f"{what}: keys {sorted(got)} vs reference {sorted(ref)}"
    msgs = []
    for k in sorted(ref):
        g = np.asarray(got[k], dtype=np.float64)
        r = np.asarray(ref[k], dtype=np.float64)
        if g.shape != r.shape:
            msgs.append(f"{k}: shape {g.shape} vs {r.shape}")
            continue
        err = np.abs(g - r)
        lim = atol + rtol * np.abs(r)
        if (err > lim).any() or not np.isfinite(g).all():
            i = np.unravel_index(int(np.argmax(err - lim)), r.shape)
            msgs.append(f"{k}: {int((err > lim).sum())}/{r.size} elements off; worst at {tuple(int(v) for v in i)}: "
                        f"ddpd {g[i]!r} vs reference {r[i]!r} (max abs err {err.max():.3g})")
    return f"{what}: " + "; ".join(msgs) if msgs else None


# ---------------------------------------------------------------------------------------
# processes


def children(pid):
    """Direct children pids of `pid` (from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            st = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(st[st.rindex(")") + 2:].split()[1])
        if ppid == pid:
            out.append(int(d.name))
    return out


def cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def alive(pid):
    """True while `pid` exists and is not a zombie."""
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return st[st.rindex(")") + 2] != "Z"


def rank_of(pid):
    """The rank of a ddpd-worker process, from where its stderr goes (OUT/rank-R.log)."""
    try:
        t = os.readlink(f"/proc/{pid}/fd/2")
    except OSError:
        return None
    name = Path(t).name
    if name.startswith("rank-") and name.endswith(".log"):
        try:
            return int(name[5:-4])
        except ValueError:
            return None
    return None


def workers_using(path_part):
    """pids of live ddpd-worker processes whose stderr or cwd or cmdline mentions
    path_part (used to find leftovers of one run)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        cl = cmdline(int(d.name))
        if not cl or not cl[0].endswith(b"ddpd-worker") or not alive(int(d.name)):
            continue
        try:
            err = os.readlink(f"/proc/{d.name}/fd/2")
        except OSError:
            err = ""
        if path_part in err:
            out.append(int(d.name))
    return out


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "rank":
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        _torch_rank(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit("usage: python3 -m pylib.ddp rank CFG.pkl RANK PORT")
