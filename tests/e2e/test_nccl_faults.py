"""test_nccl_faults.py — the NCCL backend's failure paths on the emulated GPU (issue 34), with
two `ddpd-worker` ranks started directly, as the launcher starts them (an id from
`ddpd-worker --issue-id nccl`, the CONTRACT.md §5 document on stdin, one emulated GPU each),
so that no launcher's SIGTERM mixes in:

* a peer SIGKILLed at a random point of the run, the issue's 100 rounds (about 75 s on the
  loaded 2-core machine; DDPD_NCCL_KILL_ROUNDS another number, DDPD_NCCL_KILL_SEED another
  draw): the emulator's
  DDPD_CUDA_EMU_NCCL_KILL makes the victim kill itself at a seeded random collective of its
  run, as it issues it, halfway through it, or once it is done, and the first two rounds
  kill it just after the last step (the final checkpoint's all-gathers are left). The
  survivor must end every time with exit code 3 and one `error` event of kind `comm`, the
  last line of its stdout, within timeout_s + 10 s of the death: never a signal (a SIGSEGV,
  or the SIGABRT with which the emulator ends a process that breaks NCCL's threading
  rules), never a hang. One round in four the emulator does not notice the death
  (DDPD_CUDA_EMU_NCCL_BLIND=1, as NCCL's shared-memory transport does not), and the
  survivor's own deadline (timeout_s 2) must end it;
* ddp.timeout_s 1 with compute longer than 1 s before each collective: every emulated
  kernel takes 300 ms more (DDPD_CUDA_EMU_KERNEL_DELAY_MS), so a step's forward and
  backward pass (8 kernels and more) keep the comm stream waiting 2 s and more before its
  all-reduce can begin. The job must succeed: a collective's deadline runs from when it can
  begin, not from when it was queued behind the compute.
Skipped (77) where the build has no libddpd-cuda-emu.so. On a host with two GPUs or more,
scripts/gpu-check.sh runs the kill rounds with real NCCL too (DDPD_PARITY_GPU=real,
DDPD_PARITY_GPUS=N; test_..._on_real_gpus, skipped elsewhere): real NCCL has no hook, so
the victim is SIGKILLed at a random moment of a long run."""
import json
import os
import random
import re
import subprocess
import time
from pathlib import Path

import pytest

from pylib import ddp as H
from pylib.common import emu_module, real_gpus


@pytest.fixture(autouse=True)
def _skip_code(request):
    H.install_skip_code(request.config)


@pytest.fixture
def work(tmp_path):
    return Path(H.workdir("e2e-nccl-faults-")) if os.environ.get("DDPD_TEST_TMP") else tmp_path


def emu_env(**extra):
    m = emu_module()
    if m is None:
        pytest.skip("no emulated CUDA module (libddpd-cuda-emu.so) beside ddpd-worker")
    env = {k: v for k, v in H.env1().items() if not k.startswith(("DDPD_CUDA_EMU", "CUDA_VISIBLE"))}
    env.update(DDPD_CUDA_PLUGIN=str(m), DDPD_CUDA_EMU="2")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def real_env():
    """The environment as it is, for the real module and devices (gpu-check.sh)."""
    return {k: v for k, v in H.env1().items() if not k.startswith("DDPD_CUDA_EMU")}


def spec(timeout_s, steps=4):
    return {"name": "nccl-faults", "device": "cuda", "world_size": 2,
            "model": [{"type": "linear", "in": 8, "out": 16}, {"type": "relu"},
                      {"type": "linear", "in": 16, "out": 2}],
            "loss": "mse", "optimizer": {"type": "sgd", "lr": 0.05},
            "data": {"type": "synthetic", "samples": 64, "seed": 1}, "batch_size": 4,
            "steps": steps, "log_every": 1, "init": {"seed": 0},
            "ddp": {"backend": "nccl", "timeout_s": timeout_s}}


class Group:
    """An NCCL id issuer and two ranks, rank r with the environment envs[r]."""

    def __init__(self, work, name, job, envs):
        worker = str(H.need_bin() / "ddpd-worker")
        self.out = Path(work) / name
        self.out.mkdir(parents=True)
        (Path(work) / "data").mkdir(exist_ok=True)
        self.issuer = subprocess.Popen([worker, "--issue-id", "nccl"], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=envs[0])
        ident = json.loads(self.issuer.stdout.readline().decode())["id"]
        self.logs = [self.out / f"rank-{r}.log" for r in range(2)]
        self.outs = [self.out / f"rank-{r}.ndjson" for r in range(2)]
        self.ranks = []
        for r in range(2):
            doc = {"job": 0, "attempt": 1, "rank": r, "world_size": 2,
                   "comm": {"backend": "nccl", "id": ident}, "spec": job,
                   "data_dir": str(Path(work) / "data"), "out_dir": str(self.out), "resume": None}
            with open(self.outs[r], "wb") as so, open(self.logs[r], "wb") as se:
                p = subprocess.Popen([worker], stdin=subprocess.PIPE, stdout=so, stderr=se, env=envs[r],
                                     cwd=str(work))
            p.stdin.write(json.dumps(doc).encode())
            p.stdin.close()
            self.ranks.append(p)

    def events(self, r):
        lines = self.outs[r].read_text(errors="replace").split("\n")
        return [json.loads(ln) for ln in lines if ln.strip().startswith("{")]

    def log(self, r):
        return self.logs[r].read_text(errors="replace") if self.logs[r].exists() else ""

    def describe(self, what):
        lines = [what]
        for r, p in enumerate(self.ranks):
            lines.append(f"rank {r}: exit {p.poll()}, events {self.events(r)[-3:]}\n"
                         f"  stderr: ...{self.log(r)[-1500:]}")
        return "\n".join(lines)

    def wait(self, r, timeout):
        """Rank r's exit code, or None when it is still running after `timeout` s."""
        try:
            return self.ranks[r].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self):
        for p in self.ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.issuer.stdin.close()
        try:
            self.issuer.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.issuer.kill()
            self.issuer.wait()


ISSUES = re.compile(r"ddpd nccl emulator: rank 0 issues (\w+) #(\d+)")


def calibrate(work):
    """The collectives of one clean run (the same on both ranks, as NCCL wants), by name
    in order: the emulator names each one when DDPD_CUDA_EMU_NCCL_KILL is set (here for a
    rank that does not exist)."""
    env = emu_env(DDPD_CUDA_EMU_NCCL_KILL="9:0:issue")
    g = Group(work, "calibrate", spec(30), [env, env])
    try:
        codes = [g.wait(r, 300) for r in range(2)]
        assert codes == [0, 0], g.describe(f"the clean run ended with {codes}")
        calls = [name for name, _ in ISSUES.findall(g.log(0))]
        assert calls and [int(n) for _, n in ISSUES.findall(g.log(0))] == list(range(1, len(calls) + 1)), \
            g.describe("the emulator did not name the collectives in order")
        assert f"rank 0 issued {len(calls)} collectives" in g.log(0), g.describe("no count of collectives")
        return calls
    finally:
        g.close()


def kill_points(calls, rounds, rng):
    """(seq, at) for each round: first just after the last step (the final checkpoint's two
    all-gathers are what is left: the victim dies once the collective before them is done,
    or as it issues the first), then random ones. A kill once the last collective is done
    is left out: the survivor may then end cleanly, as it should."""
    n = len(calls)
    assert calls[-2:] == ["ncclAllGather", "ncclAllGather"], calls
    points = [(n - 2, "done"), (n - 1, "issue")]
    while len(points) < rounds:
        at = rng.choice(["issue", "post", "done"])
        points.append((rng.randint(1, n - 1 if at == "done" else n), at))
    return points[:rounds]


def test_a_peer_killed_anywhere_ends_the_survivor_with_exit_3_and_an_error_event(work):
    rounds = int(os.environ.get("DDPD_NCCL_KILL_ROUNDS", "100"))
    seed = int(os.environ.get("DDPD_NCCL_KILL_SEED", "34"))
    rng = random.Random(seed)
    calls = calibrate(work)
    for i, (seq, at) in enumerate(kill_points(calls, rounds, rng)):
        victim = rng.randrange(2)
        survivor = 1 - victim
        blind = i % 4 == 3
        timeout_s = 2 if blind else 30
        extra = {"DDPD_CUDA_EMU_NCCL_BLIND": "1"} if blind else {}
        envs = [emu_env(**extra, DDPD_CUDA_EMU_NCCL_KILL=f"{victim}:{seq}:{at}") for _ in range(2)]
        what = (f"round {i} (seed {seed}): rank {victim} killed at collective {seq} of {len(calls)} "
                f"({calls[seq - 1]}, {at}){', unnoticed by NCCL' if blind else ''}")
        g = Group(work, f"round-{i}", spec(timeout_s), envs)
        try:
            code = g.wait(victim, 300)
            assert code == -9, g.describe(f"{what}: the victim ended with {code}, not SIGKILL")
            # The issue's bound, from the moment the victim was seen dead (after its death).
            code = g.wait(survivor, timeout_s + 10)
            assert code is not None, g.describe(f"{what}: the survivor still runs {timeout_s + 10} s later")
            assert code == 3, g.describe(f"{what}: the survivor ended with {code}, not 3")
            ev = g.events(survivor)
            errors = [e for e in ev if e["event"] == "error"]
            assert len(errors) == 1 and errors[0]["kind"] == "comm", g.describe(f"{what}: error events {errors}")
            assert ev[-1] is errors[0], g.describe(f"{what}: events after the error: {ev[-2:]}")
            assert f"rank {survivor}:" in errors[0]["message"], errors[0]
        finally:
            g.close()


def test_a_long_compute_before_a_collective_does_not_count_against_its_timeout(work):
    env = emu_env(DDPD_CUDA_EMU_KERNEL_DELAY_MS=300)
    steps = 2
    g = Group(work, "slow-compute", spec(1, steps=steps), [env, env])
    try:
        codes = [g.wait(r, 300) for r in range(2)]
        assert codes == [0, 0], g.describe(f"ranks ended with {codes}: a collective timed out behind the compute")
        for r in range(2):
            done = [e for e in g.events(r) if e["event"] == "done"]
            assert len(done) == 1 and done[0]["steps"] == steps, g.describe(f"rank {r}: {done}")
            # The kernels' own delay, not the machine's speed: each step ran 8 of them at least.
            assert done[0]["seconds"] >= steps * 8 * 0.3, done[0]
    finally:
        g.close()


def test_a_peer_killed_mid_training_on_real_gpus(work):
    """The kill rounds with real NCCL (scripts/gpu-check.sh, two GPUs or more): a long run,
    the victim SIGKILLed at a random moment once both ranks train; the survivor ends with
    exit code 3 and one `error` event within timeout_s + 10 s."""
    gpus = real_gpus()
    if gpus is None or gpus < 2:
        pytest.skip("real GPUs only (DDPD_PARITY_GPU=real and DDPD_PARITY_GPUS >= 2: scripts/gpu-check.sh)")
    rng = random.Random(int(os.environ.get("DDPD_NCCL_KILL_SEED", "34")))
    timeout_s = 10
    for i in range(int(os.environ.get("DDPD_NCCL_KILL_ROUNDS", "3"))):
        victim = rng.randrange(2)
        g = Group(work, f"real-{i}", spec(timeout_s, steps=10_000_000), [real_env(), real_env()])
        try:
            end = time.monotonic() + 120
            while not all(any(e["event"] == "loss" for e in g.events(r)) for r in range(2)):
                assert time.monotonic() < end and all(p.poll() is None for p in g.ranks), \
                    g.describe(f"round {i}: the ranks did not both train within 120 s")
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 1.0))
            g.ranks[victim].kill()
            g.wait(victim, 60)
            code = g.wait(1 - victim, timeout_s + 10)
            assert code == 3, g.describe(f"round {i}: rank {victim} killed: the survivor ended with {code}")
            errors = [e for e in g.events(1 - victim) if e["event"] == "error"]
            assert len(errors) == 1 and errors[0]["kind"] == "comm", g.describe(f"round {i}: {errors}")
        finally:
            g.close()
