"""parity.py — helpers of the parity tests (and of tests/e2e, bench/step and bench/ddp-step):
.npy/CSV data generation, running `ddpd run` and parsing its events, and a PyTorch 1.13
reference trainer with ddpd's semantics (schema/README.md), with the parity tolerances.
Binaries, folders and exit code 77 are pylib.common's; safetensors is pylib.safetensors.

Run with the interpreter that has torch: `/usr/bin/python3 -m pytest -q tests/parity`.
"""
import json
import math
import os
import subprocess
from pathlib import Path

import numpy as np

try:
    import pytest
except ImportError:  # bench/step imports this file without pytest installed
    pytest = None

from pylib.common import (REPO, bin_dir, device_env, device_spec, folder_for_test,  # noqa: F401
                          install_skip_code, make_workdir, on_emulated_gpu, tmp_root)
from pylib.safetensors import ST_DTYPES, st_decode, st_encode, st_load, st_save  # noqa: F401

# ---------------------------------------------------------------------------------------
# binaries and temporary folders


def ddpd_path():
    d = bin_dir()
    if d is None:
        pytest.skip("ddpd is not built (set DDPD_BIN to the build folder)")
    return d / "ddpd"


def workdir(request, tmp_path, prefix="parity-"):
    """Generator behind the `work` fixtures: a fresh folder under DDPD_TEST_TMP (removed
    after a test that passed, kept after one that failed, always kept with DDPD_KEEP_TMP=1),
    or pytest's tmp_path when DDPD_TEST_TMP is not set."""
    if not tmp_root():
        yield tmp_path
        return
    yield from folder_for_test(request, prefix)


# ---------------------------------------------------------------------------------------
# data generation


def linear_dims(model):
    """[(layer index, in, out, bias)] of the linear layers of a spec's model list."""
    return [(i, l["in"], l["out"], l.get("bias", True)) for i, l in enumerate(model) if l["type"] == "linear"]


def init_weights(model, seed):
    """Initial state_dict (numpy float32) drawn like nn.Linear's default init."""
    rng = np.random.default_rng(seed)
    sd = {}
    for i, fin, fout, bias in linear_dims(model):
        k = 1.0 / math.sqrt(fin)
        sd[f"{i}.weight"] = rng.uniform(-k, k, size=(fout, fin)).astype(np.float32)
        if bias:
            sd[f"{i}.bias"] = rng.uniform(-k, k, size=(fout,)).astype(np.float32)
    return sd


def make_xy(n, fin, fout, loss, seed, x_dtype=np.float32, y_dtype=None):
    """x [n,fin] ~ N(0,1); y [n,fout] float32 (mse, a noisy linear teacher) or [n] class
    ids (cross_entropy)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, fin)).astype(np.float32)
    w = rng.standard_normal((fin, fout)).astype(np.float32) / math.sqrt(fin)
    t = x @ w + 0.1 * rng.standard_normal((n, fout)).astype(np.float32)
    if loss == "mse":
        y = t.astype(y_dtype or np.float32)
    else:
        y = np.argmax(t, axis=1).astype(y_dtype or np.int64)
    return x.astype(x_dtype), y


def write_csv(path, x, y, target_names, loss, target_pos=None):
    """A CSV with feature columns f0.. and target column(s); targets are inserted at
    column `target_pos` (default: last). Floats are written with 17 significant digits of
    the float32 value, so strtod->float and strtof both give exactly the float32."""
    x = np.asarray(x, dtype=np.float32)
    y2 = np.asarray(y).reshape(len(x), -1)
    names = [f"f{j}" for j in range(x.shape[1])]
    cols = [["%.17g" % float(v) for v in x[:, j]] for j in range(x.shape[1])]
    if loss == "mse":
        tcols = [["%.17g" % float(v) for v in y2[:, j].astype(np.float32)] for j in range(y2.shape[1])]
    else:
        tcols = [[str(int(v)) for v in y2[:, 0]]]
    pos = len(names) if target_pos is None else target_pos
    names[pos:pos] = list(target_names)
    cols[pos:pos] = tcols
    lines = [",".join(names)]
    for r in range(len(x)):
        lines.append(",".join(c[r] for c in cols))
    Path(path).write_text("\n".join(lines) + "\n")


def read_csv_xy(path, targets, loss):
    """The reference side's reading of a CSV data file: (x float32 [N,in], y)."""
    lines = Path(path).read_text().strip().splitlines()
    names = lines[0].split(",")
    targets = [targets] if isinstance(targets, str) else list(targets)
    rows = [[float(c) for c in ln.split(",")] for ln in lines[1:]]
    a = np.array(rows, dtype=np.float64)
    ti = [names.index(t) for t in targets]
    xi = [j for j in range(len(names)) if j not in ti]
    x = a[:, xi].astype(np.float32)
    if loss == "mse":
        y = a[:, ti].astype(np.float32)
    else:
        y = a[:, ti[0]].astype(np.int64)
    return x, y


# ---------------------------------------------------------------------------------------
# running ddpd


class Run:
    """The result of one `ddpd run`: exit code, parsed events, raw output, out folder."""

    def __init__(self, proc, out, cmd):
        self.rc = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.out = Path(out)
        self.cmd = cmd
        self.events = []
        self.bad_lines = []
        for ln in self.stdout.splitlines():
            if not ln.strip():
                continue
            try:
                ev = json.loads(ln)
            except ValueError:
                self.bad_lines.append(ln)
                continue
            if isinstance(ev, dict):
                self.events.append(ev)
            else:
                self.bad_lines.append(ln)

    def of(self, kind):
        return [e for e in self.events if e.get("event") == kind]

    def losses(self):
        """{step: loss} of rank 0's loss events."""
        return {int(e["step"]): e["loss"] for e in self.of("loss") if e.get("rank", 0) == 0}

    def log_text(self):
        p = self.out / "rank-0.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def describe(self):
        return (f"$ {' '.join(map(str, self.cmd))}\nexit {self.rc}\n--- stdout (tail) ---\n"
                f"{self.stdout[-3000:]}\n--- stderr (tail) ---\n{self.stderr[-3000:]}\n"
                f"--- rank-0.log (tail) ---\n{self.log_text()[-2000:]}")

    def check_ok(self):
        assert self.rc == 0, "ddpd run failed\n" + self.describe()
        assert not self.bad_lines, "non-JSON lines on stdout: %r" % self.bad_lines[:5]
        assert self.of("done"), "no done event\n" + self.describe()
        return self


def ddpd_env(threads=1):
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def run_ddpd(spec, data_dir, out, resume=None, timeout=180, spec_path=None, extra_args=(), raw_spec=None,
             env=None):
    """Writes `spec` (a dict, as the parity device runs it: pylib.common.device_spec; or
    `raw_spec` text as is) to a file and runs
    `ddpd run --world-size 1 --out OUT --data-dir DATA [--resume R] SPEC` (with `env` added
    to its environment)."""
    exe = ddpd_path()
    data_dir = Path(data_dir)
    out = Path(out)
    if spec_path is None:
        spec_path = out.parent / (out.name + ".spec.json")
    Path(spec_path).write_text(raw_spec if raw_spec is not None else json.dumps(device_spec(spec), indent=1))
    cmd = [str(exe), "run", "--world-size", "1", "--out", str(out), "--data-dir", str(data_dir)]
    if resume is not None:
        cmd += ["--resume", str(resume)]
    cmd += list(extra_args) + [str(spec_path)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=device_env(dict(ddpd_env(), **(env or {})), 1),
                              cwd=str(data_dir))
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"ddpd run timed out after {timeout}s: {' '.join(cmd)}\n"
                             f"stdout: {(e.stdout or b'')[-2000:]!r}\nstderr: {(e.stderr or b'')[-2000:]!r}")
    return Run(proc, out, cmd)


# ---------------------------------------------------------------------------------------
# the PyTorch reference trainer


def torch_mod():
    if pytest is not None:
        return pytest.importorskip("torch")
    import torch
    return torch


def build_model(model):
    torch = torch_mod()
    nn = torch.nn
    layers = []
    for l in model:
        t = l["type"]
        if t == "linear":
            layers.append(nn.Linear(l["in"], l["out"], bias=l.get("bias", True)))
        elif t == "relu":
            layers.append(nn.ReLU())
        elif t == "tanh":
            layers.append(nn.Tanh())
        elif t == "sigmoid":
            layers.append(nn.Sigmoid())
        elif t == "gelu":
            layers.append(nn.GELU())
        else:
            raise ValueError(t)
    return nn.Sequential(*layers)


def build_optimizer(params, o):
    torch = torch_mod()
    if o["type"] == "sgd":
        return torch.optim.SGD(params, lr=o["lr"], momentum=o.get("momentum", 0.0),
                               dampening=o.get("dampening", 0.0), weight_decay=o.get("weight_decay", 0.0),
                               nesterov=o.get("nesterov", False))
    if o["type"] == "adamw":
        return torch.optim.AdamW(params, lr=o["lr"], betas=tuple(o.get("betas", (0.9, 0.999))),
                                 eps=o.get("eps", 1e-8), weight_decay=o.get("weight_decay", 0.01))
    raise ValueError(o["type"])


def load_data(spec, data_dir):
    """(x float32 [N,in], y) as ddpd reads them: float64 x converted to float32, int
    labels as int64."""
    d = spec["data"]
    data_dir = Path(data_dir)
    if d["type"] == "npy":
        x = np.load(data_dir / d["x"]).astype(np.float32)
        y = np.load(data_dir / d["y"])
    elif d["type"] == "csv":
        x, y = read_csv_xy(data_dir / d["path"], d["target"], spec["loss"])
    else:
        raise ValueError("the reference trainer reads npy and csv data only")
    if spec["loss"] == "mse":
        y = y.astype(np.float32)
        if y.ndim == 1:
            y = y[:, None]
    else:
        y = y.astype(np.int64).reshape(-1)
    return x, y


def micro_batches(n, spec):
    """[(epoch, batch, lo, hi)] of one epoch's batches in file order (shuffle false)."""
    bs = spec["batch_size"]
    nb = n // bs if spec["data"].get("drop_last", False) else -(-n // bs)
    return [(b, b * bs, min(n, (b + 1) * bs)) for b in range(nb)]


def step_plan(n, spec):
    """The optimizer steps as lists of (epoch, lo, hi) micro-batches, as ddpd's train.c
    documents them: each epoch's batches in order, `grad_accum` of them per step, and the
    last step of an epoch takes the micro-batches that are left when grad_accum does not
    divide the batch count (PyTorch's usual `if (i+1) % k == 0 or i+1 == len(loader)`).
    With `epochs` that many passes; with `steps`, epochs repeat until that many steps."""
    if spec["data"].get("shuffle", True):
        raise ValueError("the reference trainer needs data.shuffle false")
    k = spec.get("grad_accum", 1)
    per_epoch = micro_batches(n, spec)
    assert per_epoch, "no batches"
    want = spec.get("steps")
    steps = []
    epoch = 0
    while (want and len(steps) < want) or (not want and epoch < spec["epochs"]):
        for i in range(0, len(per_epoch), k):
            steps.append([(epoch, lo, hi) for _, lo, hi in per_epoch[i:i + k]])
            if want and len(steps) == want:
                break
        epoch += 1
    return steps


class Reference:
    """PyTorch's run of a spec: per-step losses (python floats of the mean of the
    micro-batch losses), per-step epoch, the trained model and optimizer, and snapshots
    of (state_dict, optimizer state) after chosen steps."""

    def __init__(self, spec, data_dir, init_sd, snapshot_steps=()):
        torch = torch_mod()
        torch.set_num_threads(1)
        self.spec = spec
        self.model = build_model(spec["model"]).float()
        self.model.load_state_dict({k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in init_sd.items()})
        self.opt = build_optimizer(self.model.parameters(), spec["optimizer"])
        loss_fn = torch.nn.MSELoss() if spec["loss"] == "mse" else torch.nn.CrossEntropyLoss()
        x, y = load_data(spec, data_dir)
        X = torch.from_numpy(x)
        Y = torch.from_numpy(y)
        self.n = len(x)
        self.batches_per_epoch = len(micro_batches(self.n, spec))
        self.losses = {}
        self.epochs = {}
        self.snapshots = {}
        for s, mbs in enumerate(step_plan(self.n, spec), start=1):
            self.opt.zero_grad()
            ls = []
            for epoch, lo, hi in mbs:
                out = self.model(X[lo:hi])
                loss = loss_fn(out, Y[lo:hi])
                loss.backward()
                ls.append(loss.item())
            self.opt.step()
            self.losses[s] = sum(ls) / len(ls)
            self.epochs[s] = mbs[-1][0]
            if s in snapshot_steps:
                self.snapshots[s] = (self.state_dict(), self.optim_state())
        self.steps = len(self.losses)

    def state_dict(self):
        return {k: v.detach().numpy().copy() for k, v in self.model.state_dict().items()}

    def optim_state(self):
        """{"<param>.<state>": array} named as in optim.safetensors."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        out = {}
        for p, st in self.opt.state.items():
            for k, v in st.items():
                if hasattr(v, "numel") and v.numel() == p.numel() and k != "step":
                    out[f"{names[id(p)]}.{k}"] = v.detach().numpy().copy()
        return out

    def param_count(self):
        return sum(p.numel() for p in self.model.parameters())


# ---------------------------------------------------------------------------------------
# comparisons

LOSS_RTOL = 1e-5
LOSS_ATOL = 1e-7
W_RTOL = 1e-5
W_ATOL = 1e-5


def _report(what, **kw):
    """With DDPD_PARITY_REPORT=FILE, appends each comparison's worst error to FILE (one
    JSON line each), to see how much room the tolerances leave."""
    p = os.environ.get("DDPD_PARITY_REPORT")
    if p:
        test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
        with open(p, "a") as f:
            f.write(json.dumps(dict(test=test, what=what, **kw)) + "\n")


def compare_losses(got, ref, rtol=LOSS_RTOL, atol=LOSS_ATOL):
    """None when every step's loss matches, else a message naming the first diverging
    step and the worst one."""
    if sorted(got) != sorted(ref):
        missing = sorted(set(ref) - set(got))[:10]
        extra = sorted(set(got) - set(ref))[:10]
        return f"steps differ: {len(got)} logged vs {len(ref)} expected; missing {missing}, unexpected {extra}"
    first = None
    worst = (0.0, None)
    for s in sorted(ref):
        g, r = got[s], ref[s]
        if g is None:
            return f"step {s}: ddpd loss is null (nonfinite), PyTorch {r!r}"
        err = abs(g - r)
        tol = max(rtol * abs(r), atol)
        if err > tol and first is None:
            first = (s, g, r, err)
        rel = err / max(abs(r), 1e-30)
        if rel > worst[0]:
            worst = (rel, s)
    _report("losses", worst_rel=worst[0], step=worst[1], steps=len(ref))
    if first is None:
        return None
    s, g, r, err = first
    return (f"first diverging step {s}: ddpd {g!r} vs PyTorch {r!r} (abs {err:.3g}, rel {err / max(abs(r), 1e-30):.3g});"
            f" worst rel {worst[0]:.3g} at step {worst[1]}; "
            f"first 5 steps ddpd {[got[s] for s in sorted(got)[:5]]} PyTorch {[ref[s] for s in sorted(ref)[:5]]}")


def compare_tensors(got, ref, rtol=W_RTOL, atol=W_ATOL, what="weights"):
    """None when the two dicts of arrays have the same keys, shapes and values within
    atol + rtol*|ref| elementwise, else a message with the worst element."""
    if sorted(got) != sorted(ref):
        return f"{what}: keys {sorted(got)} vs expected {sorted(ref)}"
    msgs = []
    worst = 0.0
    for k in sorted(ref):
        g = np.asarray(got[k], dtype=np.float64)
        r = np.asarray(ref[k], dtype=np.float64)
        if g.shape != r.shape:
            msgs.append(f"{k}: shape {g.shape} vs {r.shape}")
            continue
        err = np.abs(g - r)
        if err.size:
            worst = max(worst, float(np.max(err / (atol + rtol * np.abs(r)))))
        bad = err > atol + rtol * np.abs(r)
        if bad.any() or not np.isfinite(g).all():
            i = np.unravel_index(int(np.argmax(err - (atol + rtol * np.abs(r)))), r.shape)
            msgs.append(f"{k}: {int(bad.sum())}/{r.size} elements off; worst at {tuple(int(v) for v in i)}: "
                        f"ddpd {g[i]!r} vs PyTorch {r[i]!r} (max abs err {err.max():.3g})")
    _report(what, worst_fraction_of_tolerance=worst)
    return f"{what}: " + "; ".join(msgs) if msgs else None


def write_case(tmp, spec, x, y, init_sd, x_name="x.npy", y_name="y.npy"):
    """Saves x, y and the initial weights into the data folder `tmp`/data and points the
    spec at them. Returns (spec, data_dir)."""
    data = Path(tmp) / "data"
    data.mkdir(parents=True, exist_ok=True)
    if x is not None:
        np.save(data / x_name, x)
        np.save(data / y_name, y)
        spec["data"] = dict({"type": "npy", "x": x_name, "y": y_name, "shuffle": False}, **{
            k: v for k, v in spec.get("data", {}).items() if k not in ("type", "x", "y")})
    st_save(data / "init.safetensors", init_sd)
    spec["init"] = {"from": "init.safetensors"}
    return spec, data
