"""test_liveness.py — a host that falls silent mid-training (issue 33, the CPU backend's
liveness across hosts, docs/spec.md `ddp.timeout_s`): its packets vanish both ways (a
`tc tbf` queue of one byte on its eth0 and on the bridge's side of its link: dropped, never
refused, no RST), and the job must fail within LIVE_S (4 s) plus the launcher's teardown,
long before ddp.timeout_s, with an error that names the lost rank and its host. And no
false alarm: the same ranks beside busy loops that take the CPU from them, and a rank
stopped outright (SIGSTOP) for twice the bound, finish their jobs, since only the peers'
kernels answer what the liveness counts, never their processes."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import hostlib
from pylib import ddp as H
from test_faults import errors_of, finish, start_job, wait_for_loss

LIVE_S = 4.0  # worker/comm/cpu/cpu_impl.h
GOAL_S = 5.0  # issue 33: the job fails within this of the silence
# The assertion's bound: the goal plus the launcher's teardown (SIGTERM, the grace, the
# ranks' exits) on a 2-core machine with other builds beside; the measured delay is printed.
BOUND_S = 10.0
TIMEOUT_S = 120  # ddp.timeout_s: far beyond both, so only the liveness can end the job
BUSY = 4  # busy loops beside the ranks

SILENT = ["tbf", "rate", "8bit", "burst", "10", "limit", "1"]  # drops every frame


def silence(host):
    """Host HOST's packets vanish: what it sends (its eth0) and what is sent to it (the
    bridge's port, ddpd-vH). Returns a function that undoes it."""
    where = [["-n", f"ddpd-h{host}", "qdisc", "replace", "dev", "eth0"],
             ["qdisc", "replace", "dev", f"ddpd-v{host}"]]
    for w in where:
        subprocess.run(["tc", *w, "root", *SILENT], check=True, capture_output=True, timeout=20)

    def undo():
        for w in where:
            subprocess.run(["tc", *[x if x != "replace" else "del" for x in w], "root"], capture_output=True,
                           timeout=20)
    return undo


def big_spec(name, samples):
    # A 5.3 M-parameter MLP: each step's all-reduce moves ~21 MB around the ring, so the
    # silence lands inside one (data in flight) or between two (idle links) alike.
    return {"name": name, "world_size": 3, "device": "cpu", "model": H.mlp(256, 2048, 2048, 10),
            "loss": "mse", "optimizer": {"type": "sgd", "lr": 0.001},
            "data": {"type": "synthetic", "samples": samples, "seed": 3}, "batch_size": 4, "epochs": 1,
            "log_every": 1, "ddp": {"timeout_s": TIMEOUT_S}}


def test_silent_host_fails_the_job_naming_the_rank_and_host(hosts, work):
    # Ranks 0, 1, 2 on hosts 1, 2, 3; host 3 falls silent after the first loss. Rank 1
    # sends to it (its data goes unacknowledged), rank 0 receives from it (keepalive).
    (work / "data").mkdir()
    p, out, cmd = start_job(big_spec("silent", 12000), 3, work, "silent", (1, 2, 3))
    undo = None
    try:
        lines = wait_for_loss(p, 120)
        t0, wall0 = time.monotonic(), time.time()
        undo = silence(3)
        rest, err = finish(p, TIMEOUT_S + 60)
        took = time.monotonic() - t0
    finally:
        if undo:
            undo()
        if p.poll() is None:
            p.kill()
            p.wait()
    lines += rest.splitlines()
    assert p.returncode == 3, f"exit {p.returncode}, want 3 (a communication failure)\n{err[-2000:]}"
    evs = errors_of(lines)
    named = [e for e in evs if e.get("kind") == "comm" and e.get("rank") in (0, 1)
             and "rank 2 on host 10.77.0.3 stopped answering" in e["message"]]
    assert named, f"no error of rank 0 or 1 names rank 2 and its host:\n{evs}\n{err[-2000:]}"
    first = min(e["ts"] for e in evs) - wall0
    print(f"silent host: first error {first:.2f} s after the silence, job ended after {took:.2f} s "
          f"(goal {GOAL_S} s, bound {BOUND_S} s); {[(e['rank'], e['message']) for e in evs]}")
    assert took <= BOUND_S, f"the job took {took:.1f} s to fail after host 3 fell silent"
    assert "rank" in err and "10.77.0.3" in err, err[-2000:]
    left = hostlib.wait_no_leftovers(hosts, timeout=30)
    assert not left, "processes left after the silence:\n" + "\n".join(left)


def worker_pids(host):
    out = []
    for pid in hostlib.pids_on(f"ddpd-h{host}"):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "ddpd-worker":
                out.append(pid)
        except OSError:
            pass
    return out


def test_busy_loops_and_a_stopped_rank_are_no_false_alarm(hosts, work):
    # BUSY busy loops beside the three ranks on this 2-core machine take most of their
    # CPU; then rank 1 is stopped outright for twice LIVE_S mid-training. Its kernel still
    # acknowledges what reaches it, so nothing is lost and the job finishes.
    (work / "data").mkdir()
    busy = [subprocess.Popen(["/usr/bin/yes"], stdout=subprocess.DEVNULL) for _ in range(BUSY)]
    try:
        p, out, cmd = start_job(big_spec("busy", 3 * 4 * 24), 3, work, "busy", (1, 2, 3))
        try:
            lines = wait_for_loss(p, 300)
            pids = worker_pids(2)
            assert len(pids) == 1, pids
            stat = Path(f"/proc/{pids[0]}/stat").read_text()
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            os.kill(pids[0], signal.SIGSTOP)
            time.sleep(2 * LIVE_S)
            # nsenter (hosts-run.sh), the rank's parent, stops itself when its child stops,
            # as a shell's job control would, and waits for a SIGCONT of its own.
            os.kill(pids[0], signal.SIGCONT)
            os.kill(parent, signal.SIGCONT)
            rest, err = finish(p, 600)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    finally:
        for b in busy:
            b.kill()
            b.wait()
    lines += rest.splitlines()
    assert p.returncode == 0, f"a false alarm: exit {p.returncode}\n{errors_of(lines)}\n{err[-2000:]}"
    assert not errors_of(lines)
    done = sorted(e["rank"] for e in (json.loads(ln) for ln in lines if '"done"' in ln)
                  if e.get("event") == "done")
    assert done == [0, 1, 2], done
