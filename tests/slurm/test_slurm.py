"""test_slurm.py — `ddpd serve --launcher slurm` against a real Slurm (scripts/slurm-up.sh:
slurmctld + one slurmd on this host): jobs run as one srun whose tasks are the ranks.
A 3-rank job with join trains exactly as the local launcher does; cancel through the API
scancels it and leaves no process; a rank killed mid-run fails the job naming the rank;
a job Slurm cannot place yet waits as `queued` with squeue's reason; srun's own failure
comes back with Slurm's words. Skipped (77) when no Slurm answers.
"""
import json
import os
import signal
import time
from pathlib import Path

import pytest

from pylib import server as api
from pylib.slurm import slurm_cmd, slurm_workers, squeue

FINAL = ("succeeded", "failed", "cancelled")


def name_prefix(server):
    """The server's Slurm job name prefix: ddpd.<FNV-1a of its jobs folder>."""
    h = 2166136261
    for b in os.path.realpath(server.jobs_dir).encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return f"ddpd.{h:08x}."


def slurm_server(make_server, *extra, **kw):
    return make_server(extra=["--launcher", "slurm", *extra], **kw)


def assert_nothing_left(server, timeout=30):
    """No Slurm job of this server in the queue and none of its workers alive."""
    pre = name_prefix(server)
    api.wait_until(lambda: not squeue(pre) and not slurm_workers(pre), timeout,
                   f"Slurm jobs {pre}* and their workers to be gone (queue: {squeue(pre)}, workers: {slurm_workers(pre)})")


def join_spec():
    # 1000 samples over 3 ranks: shards of 334, 333, 333 -> uneven batch counts, join on.
    return api.seed_spec(name="slurm-join", world_size=3, batch_size=1, epochs=1,
                         ddp={"join": True}, data={"type": "synthetic", "samples": 1000, "seed": 3})


def test_three_ranks_with_join_match_the_local_launcher(slurm, make_server):
    s = slurm_server(make_server)
    job = s.submit(join_spec())
    j = s.wait_state(job["id"], FINAL, timeout=180)
    assert j["state"] == "succeeded", j
    evs = s.events(job["id"])
    states = [e["state"] for e in evs if e["event"] == "state"]
    assert states[0] == "queued" and states[-1] == "succeeded" and "running" in states, states
    losses = {}
    for e in evs:
        if e["event"] == "loss":
            losses.setdefault(e["rank"], []).append((e["step"], e["loss"]))
    assert sorted(losses) == [0, 1, 2], f"loss events by rank: {sorted(losses)}"
    joins = {e["rank"] for e in evs if e["event"] == "join"}
    assert joins == {1, 2}, f"ranks 1 and 2 have one batch less and join: {joins}"
    assert [r["exit_code"] for r in j["ranks"]] == [0, 0, 0], j["ranks"]
    out = s.jobs_dir / str(job["id"])
    for r in range(3):
        assert f"[rank {r}]" in (out / f"rank-{r}.log").read_text(), f"rank {r}'s stderr reached rank-{r}.log"
    assert j["pending_reason"] is None

    # The same job through the local launcher: the same losses, bit for bit, and the same model.
    loc = make_server(cpu_slots=3)
    lj = loc.submit(join_spec())
    assert loc.wait_state(lj["id"], FINAL, timeout=120)["state"] == "succeeded"
    llosses = {}
    for e in loc.events(lj["id"]):
        if e["event"] == "loss":
            llosses.setdefault(e["rank"], []).append((e["step"], e["loss"]))
    assert llosses == losses
    assert (out / "model.safetensors").read_bytes() == \
        (loc.jobs_dir / str(lj["id"]) / "model.safetensors").read_bytes()
    assert_nothing_left(s)


def test_cancel_through_the_api_scancels(slurm, make_server):
    s = slurm_server(make_server)
    job = s.submit(api.heavy_spec(world_size=2, steps=api.FOREVER_STEPS, name="slurm-cancel"))
    jid = job["id"]
    pre = name_prefix(s)
    s.wait_state(jid, "running", timeout=60)
    api.wait_until(lambda: len(slurm_workers(pre)) == 2, 30, "both ranks running under Slurm")
    q = squeue(pre)
    assert len(q) == 1 and q[0][1] == f"{pre}{jid}.1" and q[0][2] == "RUNNING", q
    t0 = time.monotonic()
    r = s.post(f"/v1/jobs/{jid}/cancel")
    assert r.status_code == 202, r.text
    j = s.wait_state(jid, FINAL, timeout=60)
    assert j["state"] == "cancelled", j
    # scancel sends SIGTERM first: the workers stop on their own (exit 5, CONTRACT.md §6),
    # or with a communication error (3) when the peer's SIGTERM came first.
    assert time.monotonic() - t0 < 20
    codes = [r["exit_code"] for r in j["ranks"]]
    assert 5 in codes and set(codes) <= {3, 5}, j["ranks"]
    assert_nothing_left(s)


def test_a_rank_killed_mid_run_fails_the_job_naming_it(slurm, make_server):
    s = slurm_server(make_server)
    job = s.submit(api.heavy_spec(world_size=3, steps=api.FOREVER_STEPS, name="slurm-kill", log_every=50))
    jid = job["id"]
    pre = name_prefix(s)
    s.wait_state(jid, "running", timeout=60)
    ws = api.wait_until(lambda: (lambda w: w if len(w) == 3 else None)(slurm_workers(pre)), 30, "3 ranks")
    # Every rank has trained a few steps before one dies.
    api.wait_until(lambda: (lambda rs: len(rs) == 3 and all(r.get("step") for r in rs))(s.job(jid)["ranks"]), 30,
                   "a loss from every rank")
    victim = next(p for p, r in ws.items() if r == 1)
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    j = s.wait_state(jid, FINAL, timeout=60)
    took = time.monotonic() - t0
    assert j["state"] == "failed", j
    assert took < 15, f"the failure took {took:.1f}s to show"
    assert j["error"].startswith("rank 1 failed (exit code 137)"), j["error"]
    assert "killed by signal 9" in j["error"], j["error"]
    codes = {r["rank"]: r["exit_code"] for r in j["ranks"]}
    assert codes[1] == 137, codes
    assert "task 1: Killed" in (s.jobs_dir / str(jid) / "srun.log").read_text()
    assert_nothing_left(s)


def test_pending_reason_from_squeue_then_cancel_while_pending(slurm, make_server):
    # Two ranks of half the node's CPUs each fill it; the next job waits in Slurm's queue.
    half = max(1, slurm // 2)
    s = slurm_server(make_server, "--slurm-cpus-per-task", str(half))
    big = s.submit(api.heavy_spec(world_size=2, steps=api.FOREVER_STEPS, name="slurm-fill"))
    s.wait_state(big["id"], "running", timeout=60)
    small = s.submit(api.heavy_spec(world_size=1, steps=200, name="slurm-wait"))
    pre = name_prefix(s)

    def pending():
        j = s.job(small["id"])
        return j if j["state"] == "queued" and "is pending: " in (j["pending_reason"] or "") else None
    j = api.wait_until(pending, 30, "the second job to show Slurm's pending reason")
    q = {row[1]: row for row in squeue(pre)}
    mine = q[f"{pre}{small['id']}.1"]
    assert mine[2] == "PENDING", q
    assert j["pending_reason"] == f"Slurm job {mine[0]} ({pre}{small['id']}.1) is pending: {mine[3]}"
    assert mine[3] in ("Resources", "Priority"), mine

    # The waiting job starts (and finishes) once the first is cancelled.
    assert s.post(f"/v1/jobs/{big['id']}/cancel").status_code == 202
    assert s.wait_state(big["id"], FINAL, timeout=60)["state"] == "cancelled"
    j = s.wait_state(small["id"], FINAL, timeout=120)
    assert j["state"] == "succeeded", j
    assert j["pending_reason"] is None
    states = [e["state"] for e in s.events(small["id"]) if e["event"] == "state"]
    assert states == ["queued", "starting", "running", "succeeded"], states

    # Cancelled while Slurm still holds it pending.
    big2 = s.submit(api.heavy_spec(world_size=2, steps=api.FOREVER_STEPS, name="slurm-fill2"))
    s.wait_state(big2["id"], "running", timeout=60)
    waiting = s.submit(api.heavy_spec(world_size=1, steps=200, name="slurm-wait2"))
    api.wait_until(lambda: "is pending" in (s.job(waiting["id"])["pending_reason"] or ""), 30, "pending")
    assert s.post(f"/v1/jobs/{waiting['id']}/cancel").status_code == 202
    j = s.wait_state(waiting["id"], FINAL, timeout=30)
    assert j["state"] == "cancelled", j
    assert not [r for r in squeue(pre) if r[1] == f"{pre}{waiting['id']}.1"]
    assert s.post(f"/v1/jobs/{big2['id']}/cancel").status_code == 202
    s.wait_state(big2["id"], FINAL, timeout=60)
    assert_nothing_left(s)


def test_srun_failure_comes_back_with_slurms_words(slurm, make_server):
    s = slurm_server(make_server, "--slurm-partition", "no-such-partition")
    job = s.submit(api.seed_spec(world_size=2))
    j = s.wait_state(job["id"], FINAL, timeout=60)
    assert j["state"] == "failed", j
    assert "srun for Slurm job" in j["error"] and "invalid partition" in j["error"].lower(), j["error"]
    assert_nothing_left(s)


def test_server_restart_cancels_the_earlier_servers_slurm_jobs(slurm, make_server):
    s = slurm_server(make_server)
    job = s.submit(api.heavy_spec(world_size=2, steps=api.FOREVER_STEPS, name="slurm-orphan"))
    pre = name_prefix(s)
    s.wait_state(job["id"], "running", timeout=60)
    api.wait_until(lambda: len(slurm_workers(pre)) == 2, 30, "both ranks running")
    s.kill9()  # srun dies with it (PR_SET_PDEATHSIG): the Slurm job is left behind
    s.start()
    j = s.wait_state(job["id"], FINAL, timeout=60)
    assert j["state"] == "failed" and j["error"] == "server restarted", j
    assert "cancelled 1 Slurm job (" + pre + "*) left by an earlier server" in s.stderr(), s.stderr()
    assert_nothing_left(s)


def test_time_limit_fails_the_job_with_slurms_reason(slurm, make_server):
    # Slurm's shortest limit is a minute; it checks limits every 30 s or so.
    s = slurm_server(make_server, "--slurm-time", "1")
    job = s.submit(api.heavy_spec(world_size=2, steps=api.FOREVER_STEPS, name="slurm-timeout"))
    j = s.wait_state(job["id"], FINAL, timeout=240)
    assert j["state"] == "failed", j
    # ddpd asks Slurm for its signal before the limit (--signal=USR1@60: with a one-minute
    # limit it comes at once): the ranks stop at a checkpoint, and the job fails saying it
    # reached the time limit (not a preemption: requeued, it would only reach it again).
    # Should Slurm's own TIMEOUT come first, that is the error, as before.
    pre = f"{name_prefix(s)}{job['id']}.1 (Slurm job "
    if j["error"].startswith("time limit: "):
        assert pre in j["error"] and "stopped at its checkpoint" in j["error"], j["error"]
        assert j["restarts"] == 0 and j["preemptions"] == 0, j
    else:
        assert j["error"].startswith(f"Slurm ended job {pre}"), j["error"]
        assert "TIMEOUT" in j["error"] and "DUE TO TIME LIMIT" in j["error"], j["error"]
    assert_nothing_left(s)


def test_node_failure_fails_the_job_with_slurms_reason(slurm, make_server):
    # The node goes DOWN under a running job (as when slurmctld loses a node): Slurm
    # kills the job, srun says "Node failure" and exits 0 all the same.
    node = slurm_cmd("sinfo", "--noheader", "--Node", "--format=%N").split()[0]
    s = slurm_server(make_server)
    job = s.submit(api.heavy_spec(world_size=2, steps=api.FOREVER_STEPS, name="slurm-node-fail"))
    pre = name_prefix(s)
    s.wait_state(job["id"], "running", timeout=60)
    api.wait_until(lambda: len(slurm_workers(pre)) == 2, 30, "both ranks running")
    try:
        slurm_cmd("scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=ddpd-test")
        j = s.wait_state(job["id"], FINAL, timeout=60)
    finally:
        try:
            slurm_cmd("scontrol", "update", f"NodeName={node}", "State=RESUME")
        except AssertionError:
            pass  # slurmd's next registration has brought it back already
        api.wait_until(lambda: slurm_cmd("sinfo", "--noheader", "--Node", "--format=%t").split()[0].rstrip("*~#")
                       in ("idle", "mix", "alloc"), 60, f"node {node} to be up again")
    assert j["state"] == "failed", j
    assert j["error"].startswith(f"Slurm ended job {pre}{job['id']}.1 (Slurm job "), j["error"]
    assert "NODE_FAIL" in j["error"] and f"Node failure on {node}" in j["error"], j["error"]
    assert_nothing_left(s)


def test_shutdown_takes_pending_jobs_out_of_slurm_and_keeps_them_queued(slurm, make_server):
    half = max(1, slurm // 2)
    s = slurm_server(make_server, "--slurm-cpus-per-task", str(half))
    pre = name_prefix(s)
    big = s.submit(api.heavy_spec(world_size=2, steps=api.FOREVER_STEPS, name="slurm-fill"))
    s.wait_state(big["id"], "running", timeout=60)
    small = s.submit(api.heavy_spec(world_size=1, steps=200, name="slurm-wait"))
    api.wait_until(lambda: "is pending" in (s.job(small["id"])["pending_reason"] or ""), 30, "pending")
    assert s.stop() == 0
    # The pending one is out of Slurm's queue at once; the running one ends within KillWait.
    assert not [r for r in squeue(pre) if r[1] == f"{pre}{small['id']}.1"], squeue(pre)
    api.wait_until(lambda: not squeue(pre), 30, "the cancelled running job to leave Slurm's queue")
    s.start()
    assert s.job(big["id"])["state"] == "cancelled"
    j = s.wait_state(small["id"], FINAL, timeout=120)
    assert j["state"] == "succeeded" and j["attempt"] == 2, j
    assert_nothing_left(s)
