"""test_ddp_faults.py — multi-rank `ddpd run` when things go wrong (CONTRACT.md §1, §2
`ddp.join`/`ddp.timeout_s`, §5, §6 exit codes; DDP.md §7.3):

* a rank killed with SIGKILL mid-training: the other ranks fail with a `comm` error
  (exit code 3) within 5 s, `ddpd run` exits non-zero naming the dead rank, and no
  process of the run is left;
* a rank that never shows up: rank 0 of a world of 2 started by hand (CONTRACT.md §5
  document on stdin, id from `ddpd-worker --issue-id cpu`) gives up after
  `ddp.timeout_s` with exit code 3 and a `comm` error about the rendezvous;
* uneven batch counts with `join: false`: exit code 2 before any rank starts (sharded
  data), or a clear error from the ranks instead of a hang (`{rank}` files);
* SIGINT / SIGTERM to `ddpd run`: every rank stops, non-zero exit, nothing left; SIGKILL
  to `ddpd run`: its workers die with it.
"""
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pylib import ddp as H


@pytest.fixture(autouse=True)
def _skip_code(request):
    H.install_skip_code(request.config)


@pytest.fixture
def work(tmp_path):
    return H.workdir("e2e-ddp-faults-") if os.environ.get("DDPD_TEST_TMP") else tmp_path


def long_spec(world, timeout_s=None):
    """A job that runs for many minutes (about 700 steps/s on one core), logging often."""
    s = {"name": "ddp-fault", "device": "cpu", "world_size": world,
         "model": [{"type": "linear", "in": 64, "out": 256}, {"type": "relu"},
                   {"type": "linear", "in": 256, "out": 256}, {"type": "relu"},
                   {"type": "linear", "in": 256, "out": 8}],
         "loss": "mse", "optimizer": {"type": "sgd", "lr": 0.0001},
         "data": {"type": "synthetic", "samples": 4096, "seed": 1},
         "batch_size": 32, "steps": 1000000, "log_every": 20, "init": {"seed": 0}}
    if timeout_s is not None:
        s["ddp"] = {"timeout_s": timeout_s}
    return s


class Live:
    """A running `ddpd run`, its stdout events and stderr collected by threads, each
    stdout line with the monotonic time it arrived."""

    def __init__(self, spec, world, work, name="run"):
        bin_dir = H.need_bin()
        self.work = Path(work)
        self.out = self.work / name
        spec_path = self.work / f"{name}.spec.json"
        spec_path.write_text(json.dumps(spec))
        self.data = self.work / "data"
        self.data.mkdir(exist_ok=True)
        self.cmd = [str(bin_dir / "ddpd"), "run", "--world-size", str(world), "--out", str(self.out),
                    "--data-dir", str(self.data), str(spec_path)]
        self.p = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=H.env1(),
                                  cwd=str(self.work))
        self.lines = []  # (time, text)
        self.err = []
        self.known = set()  # every pid seen in the run's process tree
        self._t = [threading.Thread(target=self._read, args=(self.p.stdout, True), daemon=True),
                   threading.Thread(target=self._read, args=(self.p.stderr, False), daemon=True)]
        for t in self._t:
            t.start()

    def _read(self, f, is_out):
        for raw in iter(f.readline, b""):
            ln = raw.decode(errors="replace").rstrip("\n")
            if is_out:
                self.lines.append((time.monotonic(), ln))
            else:
                self.err.append(ln)

    def events(self, since=0.0):
        out = []
        for t, ln in list(self.lines):
            if t < since:
                continue
            try:
                ev = json.loads(ln)
            except ValueError:
                continue
            if isinstance(ev, dict):
                ev["_t"] = t
                out.append(ev)
        return out

    def wait_for(self, pred, timeout, what):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return
            if self.p.poll() is not None:
                time.sleep(0.2)
                if pred():
                    return
                raise AssertionError(f"ddpd run ended (exit {self.p.returncode}) while waiting for {what}\n"
                                     + self.describe())
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}\n" + self.describe())

    def losses_from_all(self, world):
        return lambda: {e.get("rank") for e in self.events() if e.get("event") == "loss"} >= set(range(world))

    def tree(self):
        """{pid: rank or None} of the processes under `ddpd run` now (ranks and issuer,
        and anything they started); remembered in self.known."""
        found = {}
        todo = [self.p.pid]
        while todo:
            for c in H.children(todo.pop()):
                if c not in found:
                    found[c] = H.rank_of(c)
                    todo.append(c)
        self.known |= set(found)
        return found

    def rank_pids(self, world):
        pids = {}
        self.wait_for(lambda: len({r for r in self.tree().values() if r is not None}) >= world, 20,
                      "every rank's process")
        for pid, r in self.tree().items():
            if r is not None:
                pids[r] = pid
        return pids

    def finish(self, timeout):
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"ddpd run still running {timeout}s later\n" + self.describe())
        for t in self._t:
            t.join(timeout=5)
        return self.p.returncode

    def leftovers(self):
        """Processes of this run still alive: every pid seen in its tree, and any
        ddpd-worker whose stderr goes into this run's out folder."""
        left = {p for p in self.known if H.alive(p) and any(b"ddpd" in a for a in H.cmdline(p))}
        left |= set(H.workers_using(str(self.out)))
        return sorted(left)

    def stderr(self):
        return "\n".join(self.err)

    def describe(self):
        logs = ""
        for f in sorted(self.out.glob("*.log")) if self.out.exists() else []:
            logs += f"--- {f.name} (tail) ---\n{f.read_text(errors='replace')[-1200:]}\n"
        tail = "\n".join(ln for _, ln in self.lines[-25:])
        return (f"$ {' '.join(self.cmd)}\nexit {self.p.poll()}\n--- stdout (tail) ---\n{tail}\n"
                f"--- stderr ---\n{self.stderr()[-3000:]}\n{logs}")

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        for pid in self.known:
            if H.alive(pid) and any(b"ddpd" in a for a in H.cmdline(pid)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


@pytest.fixture
def live():
    runs = []

    def start(*a, **kw):
        r = Live(*a, **kw)
        runs.append(r)
        return r

    yield start
    for r in runs:
        r.kill()


def wait_gone(pids, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not any(H.alive(p) for p in pids):
            return []
        time.sleep(0.05)
    return [p for p in pids if H.alive(p)]


# ---------------------------------------------------------------------------------------
# a rank dies


def kill_one_rank(run, world, victim):
    """Waits for training on every rank, SIGKILLs rank `victim`, waits for `ddpd run`.
    Returns (exit code, kill time, survivors {rank: pid}, pids still alive 5 s later)."""
    run.wait_for(run.losses_from_all(world), 60, "loss events from every rank")
    pids = run.rank_pids(world)
    assert sorted(pids) == list(range(world)), f"rank processes {pids}"
    run.tree()
    time.sleep(0.3)
    t_kill = time.monotonic()
    os.kill(pids[victim], signal.SIGKILL)
    survivors = {r: p for r, p in pids.items() if r != victim}
    still = wait_gone(list(survivors.values()), 5.0)
    rc = run.finish(30)
    return rc, t_kill, survivors, still


@pytest.mark.parametrize("world,victim", [(2, 1), (3, 1)], ids=["w2_kill_rank1", "w3_kill_rank1"])
def test_rank_sigkilled_mid_training(work, live, world, victim):
    """The survivors fail fast with a comm error, the run fails, nothing is left."""
    run = live(long_spec(world), world, work)
    rc, t_kill, survivors, still = kill_one_rank(run, world, victim)
    problems = []
    if still:
        problems.append(f"surviving ranks' processes {still} still alive 5 s after rank {victim} was killed")
    errs = [e for e in run.events(since=t_kill) if e.get("event") == "error"]
    for r in survivors:
        mine = [e for e in errs if e.get("rank") == r]
        if not mine:
            problems.append(f"rank {r}: no error event after rank {victim} died")
        elif not any(e.get("kind") == "comm" for e in mine):
            problems.append(f"rank {r}: error events {[(e.get('kind'), e.get('message')) for e in mine]}, want kind 'comm'")
        elif min(e["_t"] for e in mine if e.get("kind") == "comm") - t_kill > 5.0:
            problems.append(f"rank {r}: comm error only {min(e['_t'] for e in mine) - t_kill:.1f}s after the kill")
    if any(e.get("event") == "done" for e in run.events(since=t_kill)):
        problems.append("a done event after a rank died")
    if rc == 0:
        problems.append("ddpd run exited 0 although a rank was killed")
    left = run.leftovers()
    if left:
        problems.append(f"processes of the run still alive after ddpd run exited: "
                        f"{[(p, H.cmdline(p)) for p in left]}")
    assert not problems, "\n".join(problems) + "\n\n" + run.describe()


@pytest.mark.parametrize("world,victim", [(2, 1), (3, 1)], ids=["w2_kill_rank1", "w3_kill_rank1"])
def test_rank_sigkilled_ddpd_run_names_the_dead_rank(work, live, world, victim):
    """`ddpd run`'s stderr blames the rank that died first (killed by signal 9), not a
    survivor that failed because of it (exit code 3, comm)."""
    run = live(long_spec(world), world, work)
    rc, _, _, _ = kill_one_rank(run, world, victim)
    err = run.stderr()
    assert rc != 0, run.describe()
    assert re.search(rf"rank {victim} failed", err), \
        f"stderr does not say 'rank {victim} failed':\n{err[-800:]}\n\n" + run.describe()
    assert re.search(r"signal 9|SIGKILL|Killed", err), \
        f"stderr does not say rank {victim} was killed by signal 9:\n{err[-800:]}\n\n" + run.describe()


# ---------------------------------------------------------------------------------------
# a rank never shows up


def test_rank_never_shows_up_times_out(work):
    bin_dir = H.need_bin()
    worker = str(bin_dir / "ddpd-worker")
    issuer = subprocess.Popen([worker, "--issue-id", "cpu"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=H.env1())
    rank0 = None
    try:
        line = issuer.stdout.readline().decode()
        ident = json.loads(line)["id"]
        assert re.fullmatch(r"[0-9a-fA-F]+", ident), line
        out = work / "out"
        out.mkdir()
        (work / "data").mkdir(exist_ok=True)
        spec = long_spec(2, timeout_s=2)
        spec["steps"] = 10
        doc = {"job": 0, "attempt": 1, "rank": 0, "world_size": 2,
               "comm": {"backend": "cpu", "id": ident}, "spec": spec,
               "data_dir": str(work / "data"), "out_dir": str(out), "resume": None}
        t0 = time.monotonic()
        rank0 = subprocess.Popen([worker], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=H.env1(), cwd=str(work))
        try:
            so, se = rank0.communicate(json.dumps(doc).encode(), timeout=30)
        except subprocess.TimeoutExpired:
            rank0.kill()
            so, se = rank0.communicate()
            raise AssertionError(f"rank 0 still waiting 30 s later (ddp.timeout_s is 2)\nstdout {so[-2000:]!r}\n"
                                 f"stderr {se[-2000:]!r}")
        dt = time.monotonic() - t0
        so, se = so.decode(errors="replace"), se.decode(errors="replace")
        what = f"\nexit {rank0.returncode} after {dt:.2f}s\nstdout:\n{so[-2000:]}\nstderr:\n{se[-2000:]}"
        assert rank0.returncode == 3, "want exit code 3 (communication failure)" + what
        assert 1.5 <= dt <= 8.0, "want the failure after ddp.timeout_s = 2 s (about 2-5 s)" + what
        evs = [json.loads(ln) for ln in so.splitlines() if ln.strip()]
        errs = [e for e in evs if e.get("event") == "error"]
        assert errs and errs[-1].get("kind") == "comm", "want an error event of kind 'comm'" + what
        assert re.search(r"time|rendezvous|deadline|waiting|peer|rank 1", errs[-1].get("message", ""), re.I), \
            "the error should say what timed out" + what
        assert not [e for e in evs if e.get("event") in ("loss", "done")], "trained without its peer" + what
    finally:
        if rank0 is not None and rank0.poll() is None:
            rank0.kill()
            rank0.wait()
        issuer.stdin.close()  # ends the issuer
        try:
            issuer.wait(timeout=10)
        except subprocess.TimeoutExpired:
            issuer.kill()
            issuer.wait()
            raise AssertionError("the id issuer did not exit 10 s after its stdin closed")


# ---------------------------------------------------------------------------------------
# uneven inputs with join off


def small_spec(world, data, join):
    return {"name": "uneven", "device": "cpu", "world_size": world,
            "model": [{"type": "linear", "in": 3, "out": 2}], "loss": "mse",
            "optimizer": {"type": "sgd", "lr": 0.1}, "data": data, "batch_size": 1, "epochs": 1,
            "ddp": {"join": join}, "init": {"seed": 0}, "log_every": 1}


def test_uneven_sharded_join_false_rejected_before_start(work):
    H.need_bin()
    x, y = H.make_xy(11, 3, 2, "mse", seed=1)  # ranks get 6 and 5 samples
    (work / "data").mkdir()
    np.save(work / "data" / "x.npy", x)
    np.save(work / "data" / "y.npy", y)
    spec = small_spec(2, {"type": "npy", "x": "x.npy", "y": "y.npy", "shuffle": False}, False)
    t0 = time.monotonic()
    run = H.run_ddpd(spec, 2, work, timeout=60)
    what = "\n" + run.describe()
    assert run.rc == 2, "want exit code 2" + what
    assert "ddp.join" in run.stderr, "stderr should name ddp.join" + what
    assert not run.of("start") and not run.of("loss"), "a rank started" + what
    logs = list(run.out.glob("rank-*.log")) if run.out.exists() else []
    assert not logs, f"a rank started: {logs}" + what
    assert time.monotonic() - t0 < 30


def test_uneven_rank_files_join_false_fails_cleanly(work):
    H.need_bin()
    x, y = H.make_xy(11, 3, 2, "mse", seed=1)
    (work / "data").mkdir()
    for r, (lo, hi) in enumerate([(0, 4), (4, 11)]):
        np.save(work / "data" / f"x_{r}.npy", x[lo:hi])
        np.save(work / "data" / f"y_{r}.npy", y[lo:hi])
    spec = small_spec(2, {"type": "npy", "x": "x_{rank}.npy", "y": "y_{rank}.npy", "shuffle": False}, False)
    run = H.run_ddpd(spec, 2, work, timeout=60)
    what = "\n" + run.describe()
    assert run.rc == 2, "want exit code 2 (bad input)" + what
    assert "ddp.join" in run.stderr, "stderr should name ddp.join" + what
    errs = run.of("error")
    assert errs and any("ddp.join" in e.get("message", "") for e in errs), "want an error event naming ddp.join" + what
    assert not run.of("done"), what
    assert not H.workers_using(str(run.out)), "ranks left running"


# ---------------------------------------------------------------------------------------
# stopping ddpd run


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_to_ddpd_run_stops_every_rank(work, live, sig):
    run = live(long_spec(2), 2, work)
    run.wait_for(run.losses_from_all(2), 60, "loss events from every rank")
    pids = run.rank_pids(2)
    run.tree()
    t0 = time.monotonic()
    os.kill(run.p.pid, sig)
    rc = run.finish(20)
    dt = time.monotonic() - t0
    problems = []
    if rc == 0:
        problems.append(f"ddpd run exited 0 after {sig.name}")
    still = wait_gone(list(pids.values()), 2.0)
    if still:
        problems.append(f"rank processes {still} alive after ddpd run exited")
    left = run.leftovers()
    if left:
        problems.append(f"processes of the run still alive: {[(p, H.cmdline(p)) for p in left]}")
    if dt > 15:
        problems.append(f"ddpd run took {dt:.1f}s to stop")
    if any(e.get("event") == "done" for e in run.events(since=t0 + 0.5)):
        problems.append("a rank reported done after the signal")
    assert not problems, "\n".join(problems) + "\n\n" + run.describe()


def test_sigkill_to_ddpd_run_takes_the_workers_down(work, live):
    run = live(long_spec(2), 2, work)
    run.wait_for(run.losses_from_all(2), 60, "loss events from every rank")
    run.rank_pids(2)
    tree = run.tree()
    os.kill(run.p.pid, signal.SIGKILL)
    run.finish(10)
    still = wait_gone(list(tree), 5.0)
    still = [p for p in still if any(b"ddpd" in a for a in H.cmdline(p))]
    assert not still, f"processes of the run alive 5 s after ddpd run was SIGKILLed: " \
                      f"{[(p, H.cmdline(p)) for p in still]}"
