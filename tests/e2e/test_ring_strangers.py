"""test_ring_strangers.py — strangers at a rank's ring port (issue 28, item 1; docs/security.md).

A 2-rank job whose rank 0 gets two connections on its ring port while it waits in the
rendezvous, before rank 1 exists: one sends 64 random bytes, one says nothing; both stay
open until the job ends. The job trains to the same losses, bit for bit, as the job without
them, and with `ddp.timeout_s` 60 it does not wait out the silent one (it succeeds; before,
it failed after 60 s blaming rank 1, and the random bytes failed it at once with "carries
the wrong magic"). Rank 0's log names both strangers by address.

The ranks are started by hand as the launcher starts them (the issuer's id, the document on
stdin), so that rank 1 starts only once the strangers are in; rank 0's ring port is found as
anyone on the host sees it listening, in /proc/PID/net/tcp."""
import json
import os
import socket
import subprocess
import time

import pytest

from pylib import ddp as H


@pytest.fixture(autouse=True)
def _skip_code(request):
    H.install_skip_code(request.config)


@pytest.fixture
def work(tmp_path):
    return H.workdir("e2e-ring-strangers-") if os.environ.get("DDPD_TEST_TMP") else tmp_path


SPEC = {"name": "strangers", "device": "cpu", "world_size": 2,
        "model": [{"type": "linear", "in": 8, "out": 16}, {"type": "relu"}, {"type": "linear", "in": 16, "out": 2}],
        "loss": "mse", "optimizer": {"type": "sgd", "lr": 0.01},
        "data": {"type": "synthetic", "samples": 256, "seed": 3},
        "batch_size": 8, "epochs": 1, "log_every": 1, "init": {"seed": 0}, "ddp": {"timeout_s": 60}}


def listening_port(pid):
    """The TCP port process PID listens on (its ring port), or None while it has none."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        rows = open(f"/proc/{pid}/net/tcp").read().splitlines()[1:]
    except OSError:
        return None
    for row in rows:
        f = row.split()
        if f[3] == "0A" and f[9] in inodes:  # LISTEN, one of its sockets
            return int(f[1].split(":")[1], 16)
    return None


def start_rank(worker, rank, ident, work):
    out = work / f"out-{rank}"
    out.mkdir(exist_ok=True)
    doc = {"job": 0, "attempt": 1, "rank": rank, "world_size": 2, "comm": {"backend": "cpu", "id": ident},
           "spec": SPEC, "data_dir": str(work / "data"), "out_dir": str(out), "resume": None}
    path = work / f"rank-{rank}.json"
    path.write_text(json.dumps(doc))
    with open(path, "rb") as stdin:
        return subprocess.Popen([worker], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=H.env1(), cwd=str(work))


def run_job(work, strangers):
    """Runs the job by hand; with `strangers`, rank 0 gets them before rank 1 starts.
    Returns (each rank's events, rank 0's log, the strangers' addresses)."""
    worker = str(H.need_bin() / "ddpd-worker")
    (work / "data").mkdir(exist_ok=True)
    issuer = subprocess.Popen([worker, "--issue-id", "cpu"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=H.env1())
    ranks, held = [], []
    try:
        ident = json.loads(issuer.stdout.readline())["id"]
        ranks.append(start_rank(worker, 0, ident, work))
        if strangers:
            deadline = time.monotonic() + 30
            while (port := listening_port(ranks[0].pid)) is None:
                assert time.monotonic() < deadline and ranks[0].poll() is None, "rank 0 never listened"
                time.sleep(0.005)
            noisy = socket.create_connection(("127.0.0.1", port), timeout=30)
            noisy.sendall(os.urandom(64))
            silent = socket.create_connection(("127.0.0.1", port), timeout=30)
            held = [noisy, silent]
        ranks.append(start_rank(worker, 1, ident, work))
        outs = []
        for p in ranks:
            try:
                so, se = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                so, se = p.communicate()
            outs.append((p.returncode, so.decode(errors="replace"), se.decode(errors="replace")))
        for r, (rc, so, se) in enumerate(outs):
            assert rc == 0, f"rank {r} exited {rc}\nstdout:\n{so[-2000:]}\nstderr:\n{se[-2000:]}"
        events = [[json.loads(ln) for ln in so.splitlines() if ln.strip()] for _, so, _ in outs]
        return events, outs[0][2], ["127.0.0.1:%d" % s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
        issuer.stdin.close()  # ends the issuer
        issuer.wait(timeout=30)


def losses(events):
    return [(e["step"], e["loss"]) for e in events if e["event"] == "loss"]


def test_strangers_at_the_ring_port_do_not_stop_the_job(work):
    (work / "ref").mkdir()
    (work / "strangers").mkdir()
    ref, _, _ = run_job(work / "ref", False)
    got, log0, who = run_job(work / "strangers", True)
    for r in range(2):
        assert losses(ref[r]), f"rank {r} logged no loss"
        assert losses(got[r]) == losses(ref[r]), f"rank {r}: losses differ from the job without strangers"
        assert [e["event"] for e in got[r]][-1] == "done", got[r][-3:]
    noisy, silent = who
    assert f"dropped a connection from {noisy}: not a ring hello" in log0, log0
    assert f"dropped a connection from {silent}" in log0, log0
    print(f"rank 0's log:\n{log0}")
