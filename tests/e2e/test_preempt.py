"""test_preempt.py — a preemption on the ranks' side (issue 32): SIGUSR1 to `ddpd run`
(which forwards it to every rank, as the server's launch_preempt does) while a 2-rank GPT
trains. Every rank checkpoints at the next optimizer step S they agree on (one collective
after each step), writes OUT/ckpt-S, emits its `checkpoint` event, logs "preempted:
checkpoint at step S, exiting" and ends with exit code 6, as does `ddpd run`; no final
model, no `done`. Resumed from ckpt-S (`ddpd run --resume`), the job ends with a
`model.safetensors` byte-identical to the run that was never preempted, with every loss
equal: on even shards, with grad_accum 2, on uneven per-rank files (join: the rank with
fewer windows shadows most steps, so S is mostly a shadowed step for it), twice in a row,
and on the emulated GPU with NCCL. A SIGUSR1 whose step is the job's last just finishes
the job. The signal is sent once a `loss` event past a step has come (polled with a
deadline), never after a fixed sleep.
"""
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pylib import ddp as H
from pylib.common import emu_module

VOCAB, T = 32, 8


@pytest.fixture(autouse=True)
def _skip_code(request):
    H.install_skip_code(request.config)


@pytest.fixture
def work(tmp_path):
    w = H.workdir("e2e-preempt-") if os.environ.get("DDPD_TEST_TMP") else tmp_path
    (Path(w) / "data").mkdir(exist_ok=True)
    return Path(w)


def gpt(dim=16, heads=2, p=0.1):
    """A one-block GPT with dropout (its masks must be drawn again the same after a resume)."""
    lin = lambda i, o: {"type": "linear", "in": i, "out": o}
    return [{"type": "embedding", "num": VOCAB, "dim": dim}, {"type": "position", "max": T, "dim": dim},
            {"type": "residual", "layers": [{"type": "layernorm", "dim": dim},
                                            {"type": "attention", "dim": dim, "heads": heads}]},
            {"type": "residual", "layers": [{"type": "layernorm", "dim": dim}, lin(dim, 4 * dim),
                                            {"type": "gelu", "approximate": "tanh"}, lin(4 * dim, dim),
                                            {"type": "dropout", "p": p}]},
            {"type": "layernorm", "dim": dim}, lin(dim, VOCAB)]


def write_tokens(work, sizes, name="tok"):
    """Per-rank token files of sizes[r] windows (or one file when one size is given)."""
    rng = np.random.default_rng(5)
    for r, n in enumerate(sizes):
        rng.integers(0, VOCAB, size=n * T + 1).astype(np.uint16).tofile(
            work / "data" / (f"{name}_{r}.bin" if len(sizes) > 1 else f"{name}.bin"))
    path = name + ("_{rank}.bin" if len(sizes) > 1 else ".bin")
    return {"type": "tokens", "path": path, "block_size": T, "shuffle": len(sizes) == 1}


def spec(data, steps=400, grad_accum=1, device="cpu"):
    """An AdamW GPT with a cosine schedule over `steps` (a resume that took S for the end
    would differ), logging every step."""
    s = {"name": "preempt", "device": device, "model": gpt(), "input_shape": [T], "loss": "cross_entropy",
         "optimizer": {"type": "adamw", "lr": 0.003, "schedule": {"type": "cosine", "warmup_steps": 5}},
         "data": data, "batch_size": 2, "grad_accum": grad_accum, "steps": steps, "init": {"seed": 3},
         "log_every": 1}
    if device == "cuda":
        s["ddp"] = {"backend": "nccl"}
    return s


def env_for(device, world):
    env = H.env1()
    if device == "cuda":
        m = emu_module()
        if m is None:
            pytest.skip("libddpd-cuda-emu.so is not built")
        env.update(DDPD_CUDA_PLUGIN=str(m), DDPD_CUDA_EMU=str(world))
        env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def run(work, s, name, world=2, extra=(), preempt_after=None, timeout=300):
    """`ddpd run` of spec `s`; with preempt_after=k, SIGUSR1 once a loss event of step > k
    has come. Returns H.Run (rc, events, out)."""
    spec_path = work / f"{name}.spec.json"
    spec_path.write_text(json.dumps(s, indent=1))
    out = work / name
    cmd = H.ddpd_cmd(world, spec_path, out, work / "data", extra)
    err_path = work / f"{name}.stderr"
    with open(err_path, "w") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                             env=env_for(s["device"], world), cwd=str(work))
        timer = threading.Timer(timeout, p.kill)  # the deadline of the whole run
        timer.start()
        lines, sent = [], False
        try:
            for line in p.stdout:  # ends when ddpd run exits (or the deadline kills it)
                lines.append(line)
                if preempt_after is not None and not sent:
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue
                    if ev.get("event") == "loss" and ev.get("step", 0) > preempt_after:
                        p.send_signal(signal.SIGUSR1)
                        sent = True
            rc = p.wait(timeout=30)
        finally:
            timer.cancel()
    r = H.Run(rc, "".join(lines), err_path.read_text(errors="replace"), out, cmd)
    assert rc != -signal.SIGKILL, "ddpd run did not end within its deadline\n" + r.describe()
    return r


def preempted(r, world=2):
    """Checks a preempted run and returns its step S."""
    assert r.rc == 6, "ddpd run should exit 6 when preempted\n" + r.describe()
    assert not r.of("done") and not r.of("error"), r.describe()
    assert not (r.out / "model.safetensors").exists(), "a preempted run has no final model"
    ckpts = r.of("checkpoint")
    assert ckpts, "no checkpoint event\n" + r.describe()
    S = ckpts[-1]["step"]
    assert (r.out / f"ckpt-{S}").is_dir()
    for rank in range(world):
        assert f"preempted: checkpoint at step {S}, exiting" in r.log(rank), r.describe()
    assert max(e["step"] for e in r.of("loss")) == S, "every rank stops after step S"
    assert "--resume" in r.stderr
    return S


def losses(*runs):
    return {(e["rank"], e["step"]): e["loss"] for r in runs for e in r.of("loss")}


def same_model(a, b):
    x, y = (a.out / "model.safetensors").read_bytes(), (b.out / "model.safetensors").read_bytes()
    assert x == y, "the resumed run's model.safetensors differs from the straight run's"


def check_preempt_resume(work, s, world=2, times=1):
    H.need_bin()
    straight = run(work, s, "straight", world)
    straight.check_ok(world)
    runs, resume, after = [], (), 3
    for i in range(times):
        r = run(work, s, f"part{i}", world, extra=resume, preempt_after=after)
        S = preempted(r, world)
        assert S < s["steps"]
        runs.append(r)
        resume, after = ("--resume", str(r.out / f"ckpt-{S}")), S + 3
    last = run(work, s, "last", world, extra=resume)
    last.check_ok(world)
    runs.append(last)
    want, got = losses(straight), losses(*runs)
    assert sorted(got) == sorted(want)
    bad = [k for k in want if got[k] != want[k]]
    assert not bad, [(k, want[k], got[k]) for k in bad[:5]]
    same_model(straight, last)
    return straight, runs


def test_even_shards(work):
    check_preempt_resume(work, spec(write_tokens(work, [96])))


def test_grad_accum(work):
    check_preempt_resume(work, spec(write_tokens(work, [96]), grad_accum=2))


def test_uneven_ranks_join(work):
    """Rank 1 has 4 windows (1 step an epoch of 10), so it shadows most steps: S is then a
    step it shadowed, and the checkpoint holds each rank's replica as one taken by
    checkpoint.every_steps at that step does."""
    straight, runs = check_preempt_resume(work, spec(write_tokens(work, [20, 4]), steps=300))
    assert straight.of("join"), "rank 1 should join"


def test_twice_in_a_row(work):
    check_preempt_resume(work, spec(write_tokens(work, [96])), times=2)


def test_emulated_gpu_nccl(work):
    check_preempt_resume(work, spec(write_tokens(work, [96]), steps=120, device="cuda"))


def test_signal_at_the_last_step_finishes_the_job(work):
    """A 1-rank run signalled after its last step's loss: nothing to resume, exit 0 and
    the final model (or, when the signal came earlier, a preemption as usual)."""
    H.need_bin()
    s = spec(write_tokens(work, [12]), steps=6)
    r = run(work, s, "short", world=1, preempt_after=5)
    if r.rc == 6:  # the signal came before step 6 ended: a preemption
        preempted(r, world=1)
    else:
        r.check_ok(1)
        assert (r.out / "model.safetensors").exists()
