"""test_worker_signals.py — `ddpd-worker` ranks started directly, as the launcher starts
them (CONTRACT.md §5 document on stdin, id from `ddpd-worker --issue-id cpu`), when they
are cancelled or their stdin fails (issue 15, items 14 and 10):

* a cancel is a cancel: SIGTERM at a random moment (rendezvous, start, training) to every
  rank of a 2- or 4-rank group (as the launcher's process-group signal), or during training
  to one rank only, ends every rank with exit code 5 and, where a rank says why, an error
  event of kind `cancelled`, never a `comm` failure (exit code 3); the ranks start with
  SIGTERM blocked, as the launcher starts them (server/proc.c, hold_term), so a SIGTERM
  that comes before a rank has installed its handler, even before its exec, waits for it
  and is a cancel too, never a death by the signal (exit -15);
* a stdin that cannot be read (a directory, a write-only descriptor) ends the rank with an
  `io` error naming stdin, and a non-blocking stdin with nothing in it yet is waited for
  without using the CPU: the CPU time the process consumed is read from /proc (or its
  rusage), not inferred from the wall clock.
"""
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pylib import ddp as H

TICK = os.sysconf("SC_CLK_TCK")


@pytest.fixture(autouse=True)
def _skip_code(request):
    H.install_skip_code(request.config)


@pytest.fixture
def work(tmp_path):
    return H.workdir("e2e-worker-signals-") if os.environ.get("DDPD_TEST_TMP") else tmp_path


def long_spec(world):
    """Minutes of training (about 700 steps/s on one core), logging often."""
    return {"name": "cancel-me", "device": "cpu", "world_size": world,
            "model": [{"type": "linear", "in": 64, "out": 256}, {"type": "relu"},
                      {"type": "linear", "in": 256, "out": 8}],
            "loss": "mse", "optimizer": {"type": "sgd", "lr": 0.0001},
            "data": {"type": "synthetic", "samples": 4096, "seed": 1},
            "batch_size": 32, "steps": 1000000, "log_every": 5, "init": {"seed": 0},
            "ddp": {"timeout_s": 60}}


def hold_term():
    """In the child between fork and exec: SIGTERM blocked, as the launcher starts a rank
    (server/launch.c, proc_spawn's hold_term); the rank unblocks it once its handler is in
    place."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def term_before_exec():
    """hold_term, and a SIGTERM sent there: the earliest moment a launcher's cancel can
    reach a rank, before the program has run at all."""
    hold_term()
    os.kill(os.getpid(), signal.SIGTERM)


class Group:
    """An issuer and `world` ranks in one process group (as the launcher starts them)."""

    def __init__(self, work, world, name, preexec=hold_term):
        worker = str(H.need_bin() / "ddpd-worker")
        self.world = world
        self.issuer = subprocess.Popen([worker, "--issue-id", "cpu"], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=H.env1())
        ident = json.loads(self.issuer.stdout.readline().decode())["id"]
        out = Path(work) / name
        out.mkdir(parents=True)
        (Path(work) / "data").mkdir(exist_ok=True)
        self.logs = [out / f"rank-{r}.log" for r in range(world)]
        self.outs = [out / f"rank-{r}.ndjson" for r in range(world)]
        self.ranks = []
        pgid = 0
        for r in range(world):
            doc = {"job": 0, "attempt": 1, "rank": r, "world_size": world,
                   "comm": {"backend": "cpu", "id": ident}, "spec": long_spec(world),
                   "data_dir": str(Path(work) / "data"), "out_dir": str(out), "resume": None}
            with open(self.outs[r], "wb") as so, open(self.logs[r], "wb") as se:
                p = subprocess.Popen([worker], stdin=subprocess.PIPE, stdout=so, stderr=se, env=H.env1(),
                                     cwd=str(work), process_group=pgid, preexec_fn=preexec)
            if pgid == 0:
                pgid = p.pid
            # As the launcher does: a rank already ended (a SIGTERM before its exec) has
            # closed its stdin; its exit status says the rest.
            try:
                p.stdin.write(json.dumps(doc).encode())
                p.stdin.close()
            except BrokenPipeError:
                try:
                    p.stdin.close()
                except BrokenPipeError:
                    pass
            self.ranks.append(p)
        self.pgid = pgid

    def events(self, r):
        try:
            text = self.outs[r].read_text(errors="replace")
        except OSError:
            return []
        # Only whole lines: the rank may be in the middle of writing the last one.
        lines = text.split("\n")[:-1]
        return [json.loads(ln) for ln in lines if ln.strip().startswith("{")]

    def wait_training(self, timeout=60):
        """Until every rank has logged a loss (bounded)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if all(any(e.get("event") == "loss" for e in self.events(r)) for r in range(self.world)):
                return
            assert all(p.poll() is None for p in self.ranks), self.describe("a rank ended before training")
            time.sleep(0.05)
        raise AssertionError(self.describe(f"not every rank trained within {timeout} s"))

    def wait_all(self, timeout=60):
        end = time.monotonic() + timeout
        for p in self.ranks:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        left = [r for r, p in enumerate(self.ranks) if p.poll() is None]
        if left:
            os.killpg(self.pgid, signal.SIGKILL)
            for p in self.ranks:
                p.wait()
            raise AssertionError(self.describe(f"ranks {left} still running {timeout} s after SIGTERM"))

    def describe(self, what):
        lines = [what]
        for r, p in enumerate(self.ranks):
            errs = [e for e in self.events(r) if e.get("event") == "error"]
            log = self.logs[r].read_text(errors="replace")[-600:] if self.logs[r].exists() else ""
            lines.append(f"rank {r}: exit {p.poll()}, errors {errs}\n  stderr: ...{log}")
        return "\n".join(lines)

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


def check_cancelled(g, what):
    codes = [p.returncode for p in g.ranks]
    assert codes == [5] * g.world, g.describe(f"{what}: exit codes {codes}, want 5 (cancelled) for every rank")
    for r in range(g.world):
        kinds = [e.get("kind") for e in g.events(r) if e.get("event") == "error"]
        assert all(k == "cancelled" for k in kinds), g.describe(f"{what}: rank {r} reported {kinds}")


@pytest.mark.parametrize("world,rounds", [(2, 8), (4, 5)])
def test_sigterm_to_every_rank_at_any_moment_ends_every_rank_cancelled(work, world, rounds):
    """The launcher's cancel: SIGTERM to the process group, at a random moment from the
    rendezvous to well into training. Exit 3 here was the bug: a rank whose collective
    failed because a peer had already stopped reported a comm failure."""
    rng = random.Random(world * 1000 + os.getpid())
    for i in range(rounds):
        g = Group(work, world, f"all-{world}-{i}")
        try:
            delay = rng.uniform(0.0, 1.5)
            time.sleep(delay)
            os.killpg(g.pgid, signal.SIGTERM)
            g.wait_all()
            check_cancelled(g, f"round {i}, SIGTERM to all {world} ranks {delay:.3f} s after start")
        finally:
            g.close()


@pytest.mark.parametrize("world", [1, 2])
def test_sigterm_before_the_handler_is_a_cancel(work, world):
    """A cancel right after the launch reaches a rank before its handler exists. Without
    the hold the rank died of the signal (exit -15: no cancel notice for its peers, a
    signal death in its status); with SIGTERM held but never unblocked it would train on
    to the launcher's SIGKILL. Sent between fork and exec, it must end every rank at once
    with exit code 5, the rank saying it was stopped before training."""
    g = Group(work, world, f"held-{world}", preexec=term_before_exec)
    try:
        g.wait_all(timeout=60)
        check_cancelled(g, f"SIGTERM to {world} rank(s) before their exec")
        for r in range(world):
            log = g.logs[r].read_text(errors="replace")
            assert "SIGTERM before training began" in log, g.describe(f"rank {r} did not say why it stopped")
    finally:
        g.close()


@pytest.mark.parametrize("world,rounds", [(2, 4), (4, 4)])
def test_sigterm_to_one_training_rank_ends_every_rank_cancelled(work, world, rounds):
    """Only one rank is told (a launcher whose signals do not arrive together, Slurm's per-
    node steps): its peers learn from its cancel notice that the group ends by a cancel."""
    rng = random.Random(world * 7 + os.getpid())
    for i in range(rounds):
        g = Group(work, world, f"one-{world}-{i}")
        try:
            g.wait_training()
            time.sleep(rng.uniform(0.0, 0.3))
            victim = rng.randrange(world)
            g.ranks[victim].send_signal(signal.SIGTERM)
            g.wait_all()
            check_cancelled(g, f"round {i}, SIGTERM to rank {victim} of {world} only")
        finally:
            g.close()


# ---------------------------------------------------------------------------------------
# stdin (item 10)


def cpu_seconds(pid):
    """utime + stime of a live process, from /proc/PID/stat."""
    st = Path(f"/proc/{pid}/stat").read_text()
    f = st[st.rindex(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / TICK


def run_with_stdin(fd, limit_cpu=2.0, timeout=60):
    """Runs a rank with `fd` as its stdin until it exits, failing as soon as it has used
    `limit_cpu` seconds of CPU (it spins) or after `timeout` s. Returns (exit code, stdout
    text, CPU seconds used)."""
    worker = str(H.need_bin() / "ddpd-worker")
    p = subprocess.Popen([worker], stdin=fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=H.env1())
    end = time.monotonic() + timeout
    try:
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                used = ru.ru_utime + ru.ru_stime
                out = p.stdout.read().decode(errors="replace")
                p.returncode = os.waitstatus_to_exitcode(status)
                return p.returncode, out, used
            used = cpu_seconds(p.pid)
            assert used < limit_cpu, f"the rank has used {used:.2f} s of CPU reading its stdin: it spins"
            assert time.monotonic() < end, f"the rank is still reading its stdin after {timeout} s"
            time.sleep(0.05)
    finally:
        if p.returncode is None:
            p.kill()
            p.wait()


@pytest.mark.parametrize("kind", ["directory", "write-only"])
def test_unreadable_stdin_is_an_error_not_a_busy_loop(work, kind):
    if kind == "directory":
        fd = os.open(str(work), os.O_RDONLY | os.O_DIRECTORY)  # read(): EISDIR
    else:
        fd = os.open(str(work / "w"), os.O_WRONLY | os.O_CREAT, 0o600)  # read(): EBADF
    try:
        code, out, used = run_with_stdin(fd)
    finally:
        os.close(fd)
    evs = [json.loads(ln) for ln in out.splitlines() if ln.strip()]
    errs = [e for e in evs if e.get("event") == "error"]
    print(f"{kind}: exit {code}, {used:.3f} s CPU, {errs}")
    assert code == 1, f"want exit code 1 (an I/O error), got {code}: {out}"
    assert errs and errs[-1]["kind"] == "io" and "stdin" in errs[-1]["message"], out
    assert used < 1.0


def test_nonblocking_stdin_is_waited_for_without_cpu(work):
    """A non-blocking pipe with nothing in it yet (EAGAIN): the rank sleeps until the
    document comes, using next to no CPU meanwhile, then reads it."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    worker = str(H.need_bin() / "ddpd-worker")
    p = subprocess.Popen([worker], stdin=r, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=H.env1())
    os.close(r)
    try:
        # Wait (bounded) for the process to be past exec, then measure its CPU over a while.
        for _ in range(200):
            if H.cmdline(p.pid)[:1] == [worker.encode()]:
                break
            time.sleep(0.01)
        before = cpu_seconds(p.pid)
        time.sleep(1.0)
        used = cpu_seconds(p.pid) - before
        assert p.poll() is None, "the rank ended before its document came"
        assert used < 0.3, f"the rank used {used:.2f} s of CPU in 1 s waiting for its stdin: it spins"
        os.write(w, b'{"world_size": 0}')  # a document it refuses: it has read it
        os.close(w)
        w = -1
        out, _ = p.communicate(timeout=60)
        print(f"non-blocking stdin: {used:.3f} s CPU in 1 s of waiting; exit {p.returncode}")
        assert p.returncode == 2 and b"world_size" in out, out
    finally:
        if w >= 0:
            os.close(w)
        if p.poll() is None:
            p.kill()
            p.wait()
