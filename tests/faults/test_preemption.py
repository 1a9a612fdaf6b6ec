"""Preemption by checkpoint (issue 32), through a real server with 2 CPU slots: a
low-priority 2-rank GPT job is preempted by a high-priority one, waits as `preempted`,
and resumes from the checkpoint its ranks wrote when asked; its final model.safetensors
is byte for byte the same job's run alone. Also with grad_accum 2, with uneven ranks
(join), through two preemptions, with the server SIGKILLed while the job stops, and a
job that does not reach its checkpoint within its grace (stopped, restarted from its last
one, the lost steps said). None of this spends max_restarts.

The low job is held mid-run however fast it trains: each rank's events pass through a
stand-in that stops passing them at the first checkpoint event at or past a step, until
the test releases that pause (the rank blocks on its pipe, its peer in a collective).
The preemption's SIGUSR1 then waits in the rank until it runs again: it stops at its next
optimizer step.
"""
import os
import signal

import numpy as np

from pylib.server import _WorkerStandIn, wait_until

FINAL = ("succeeded", "failed", "cancelled")
STEPS = 60


class PausingAt(_WorkerStandIn):
    """Each rank pauses at the first checkpoint event at or past each step of `at` (in
    order) until release(step) for it; SIGUSR1 to the stand-in goes on to its worker."""

    def __init__(self, folder, at):
        self.folder = folder
        super().__init__(folder, "pausing-at", f"""
AT = {list(at)!r}
FOLDER = {str(folder)!r}
r, w = os.pipe()
fcntl.fcntl(w, 1031, 4096)  # F_SETPIPE_SZ
worker = real_worker(stdout=w)
signal.signal(signal.SIGUSR1, lambda *_: worker.send_signal(signal.SIGUSR1))
# The launcher starts a rank with SIGTERM and SIGUSR1 blocked (the real worker unblocks
# them once it handles them).
signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGTERM, signal.SIGUSR1}})
os.close(w)
rc = None
for line in os.fdopen(r, "rb"):
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
    if b'"checkpoint"' in line:
        step = json.loads(line).get("step", 0)
        for a in AT:
            gate = os.path.join(FOLDER, f"release-{{a}}")
            if step >= a and not os.path.exists(gate):
                open(os.path.join(FOLDER, f"paused-{{a}}"), "a").close()
                deadline = time.monotonic() + HOLD_MAX_S
                while not os.path.exists(gate) and time.monotonic() < deadline:
                    time.sleep(0.02)
                break
""")

    def paused(self, at):
        return (self.folder / f"paused-{at}").exists()

    def release_at(self, at):
        (self.folder / f"release-{at}").touch()

    def release(self):
        for p in self.folder.glob("paused-*"):
            self.release_at(p.name.split("-", 1)[1])


def gpt_spec(name, priority=50, **over):
    s = {"name": name, "world_size": 2, "priority": priority,
         "model": {"preset": "gpt", "layers": 2, "dim": 32, "heads": 2, "vocab": 64, "block_size": 16},
         "loss": "cross_entropy",
         "optimizer": {"type": "adamw", "lr": 0.003, "weight_decay": 0.01},
         "data": {"type": "tokens", "path": "preempt/train.bin", "block_size": 16, "seed": 3},
         "batch_size": 4, "steps": STEPS, "log_every": 1,
         "checkpoint": {"every_steps": 10, "keep_last": 100}}
    s.update(over)
    return s


def write_tokens(srv):
    d = srv.data_dir / "preempt"
    d.mkdir(exist_ok=True)
    rng = np.random.default_rng(7)
    rng.integers(0, 64, size=4000, dtype=np.uint16).tofile(d / "train.bin")


def final_model(srv, jid):
    return (srv.jobs_dir / str(jid) / "model.safetensors").read_bytes()


def run_alone(srv, spec):
    jid = srv.submit(spec)["id"]
    j = srv.wait_state(jid, FINAL, timeout=300)
    assert j["state"] == "succeeded", j
    return final_model(srv, jid)


def preempt_once(srv, stand, low, at, high_spec):
    """Holds `low` at its checkpoint at `at`, submits the high-priority job, waits until
    the scheduler has asked `low` to stop, then lets it run: it stops at its next step."""
    wait_until(lambda: stand.paused(at), 120, f"the low job paused at step {at}", interval=0.02)
    high = srv.submit(high_spec)["id"]
    wait_until(lambda: any(r["id"] == low and r.get("preempting") for r in srv.get("/v1/queue").json()["running"]),
               60, "the low job being preempted")
    q = srv.get("/v1/queue").json()
    pend = [p for p in q["pending"] if p["id"] == high]
    assert pend and "preempting" in pend[0]["reason"], q
    stand.release_at(at)
    return high


def check_preempted(srv, low, high, n=1):
    j = srv.job(low)
    assert j["state"] == "succeeded", j
    pre = [h for h in j["restart_history"] if h.get("reason") == "preempted"]
    assert len(pre) == n, j["restart_history"]
    assert pre[0].get("by") == high and pre[0].get("step", 0) > 0, pre
    assert j["restarts"] == 0 and j["preemptions"] == n, j
    evs = srv.events(low, timeout=60)
    states = [e for e in evs if e.get("event") == "state" and e.get("state") == "preempted"]
    assert len(states) == n and f"job {high}" in states[0]["error"], states
    assert "resumes from its checkpoint at step" in states[0]["error"], states[0]


def scenario(make_server, work, **over):
    stand = PausingAt(work / "stand", [20])
    srv = make_server(cpu_slots=2, env=stand.env)
    write_tokens(srv)
    low = srv.submit(gpt_spec("low", priority=10, **over))["id"]
    high = preempt_once(srv, stand, low, 20, gpt_spec("high", priority=80, steps=5))
    hj = srv.wait_state(high, FINAL, timeout=300)
    assert hj["state"] == "succeeded", hj
    lj = srv.wait_state(low, FINAL, timeout=300)
    assert lj["state"] == "succeeded", lj
    check_preempted(srv, low, high)
    # The low job went back to the queue and resumed after the high one had its slots.
    assert srv.job(low)["attempt"] == 2
    ref = run_alone(srv, gpt_spec("alone", priority=10, **over))
    assert final_model(srv, low) == ref, "the preempted job's final weights differ from an uninterrupted run's"


def test_a_preempted_gpt_job_resumes_bit_exactly(make_server, work):
    scenario(make_server, work)


def test_preemption_with_grad_accum(make_server, work):
    scenario(make_server, work, grad_accum=2)


def test_preemption_with_uneven_ranks_join(make_server, work):
    # 4000 tokens in windows of 17: 235 windows, shards 118 and 117: rank 1 joins at the
    # end of every epoch
    scenario(make_server, work, ddp={"join": True}, batch_size=3)


def test_two_preemptions(make_server, work):
    stand = PausingAt(work / "stand", [20, 40])
    srv = make_server(cpu_slots=2, env=stand.env)
    write_tokens(srv)
    low = srv.submit(gpt_spec("low", priority=10))["id"]
    h1 = preempt_once(srv, stand, low, 20, gpt_spec("high1", priority=80, steps=5))
    assert srv.wait_state(h1, FINAL, timeout=300)["state"] == "succeeded"
    h2 = preempt_once(srv, stand, low, 40, gpt_spec("high2", priority=60, steps=5))
    assert srv.wait_state(h2, FINAL, timeout=300)["state"] == "succeeded"
    lj = srv.wait_state(low, FINAL, timeout=300)
    assert lj["state"] == "succeeded" and lj["preemptions"] == 2 and lj["attempt"] == 3, lj
    hist = [h for h in lj["restart_history"] if h.get("reason") == "preempted"]
    assert [h["by"] for h in hist] == [h1, h2], hist
    assert hist[0]["step"] < hist[1]["step"], hist
    assert final_model(srv, low) == run_alone(srv, gpt_spec("alone", priority=10))


def test_equal_priority_is_not_preempted(make_server, work):
    stand = PausingAt(work / "stand", [20])
    srv = make_server(cpu_slots=2, env=stand.env)
    write_tokens(srv)
    low = srv.submit(gpt_spec("first", priority=50))["id"]
    wait_until(lambda: stand.paused(20), 120, "the first job paused")
    other = srv.submit(gpt_spec("second", priority=50, steps=5))["id"]
    wait_until(lambda: srv.job(other).get("pending_reason"), 30, "a pending reason")
    q = srv.get("/v1/queue").json()
    assert [r["id"] for r in q["running"]] == [low] and not q["running"][0]["preempting"], q
    assert "held by job" in q["pending"][0]["reason"], q
    stand.release()
    assert srv.wait_state(low, FINAL, timeout=300)["state"] == "succeeded"
    assert srv.job(low)["preemptions"] == 0
    assert srv.wait_state(other, FINAL, timeout=300)["state"] == "succeeded"


def test_server_killed_while_the_job_stops(make_server, work):
    # The server dies after it asked the low job to stop and before the job stopped: the
    # ranks die with it (their last checkpoint is the one at step 20); the next server
    # finds the job it was preempting, queues it as preempted, starts the high job first
    # and then resumes the low one, to the same final weights.
    stand = PausingAt(work / "stand", [20])
    srv = make_server(cpu_slots=2, env=stand.env)
    write_tokens(srv)
    low = srv.submit(gpt_spec("low", priority=10))["id"]
    wait_until(lambda: stand.paused(20), 120, "the low job paused")
    high = srv.submit(gpt_spec("high", priority=80, steps=5))["id"]
    wait_until(lambda: any(r["id"] == low and r.get("preempting") for r in srv.get("/v1/queue").json()["running"]),
               60, "the low job being preempted")
    srv.kill9()
    stand.release()
    srv.assert_no_workers(timeout=30)
    srv.start()
    hj = srv.wait_state(high, FINAL, timeout=300)
    lj = srv.wait_state(low, FINAL, timeout=300)
    assert hj["state"] == "succeeded" and lj["state"] == "succeeded", (hj, lj)
    assert lj["restarts"] == 0 and lj["preemptions"] == 1, lj
    pre = [h for h in lj["restart_history"] if h.get("reason") == "preempted"]
    assert len(pre) == 1 and pre[0]["by"] == high, lj["restart_history"]
    # The high job ran before the low one resumed.
    assert hj["finished_at"] <= srv.job(low)["finished_at"]
    assert final_model(srv, low) == run_alone(srv, gpt_spec("alone", priority=10))


class Deaf(_WorkerStandIn):
    """Ranks whose stand-in ignores SIGUSR1 (the worker never hears it) and pauses at the
    checkpoint at `at` until release: a job that cannot checkpoint within its grace."""

    def __init__(self, folder, at):
        self.folder = folder
        super().__init__(folder, "deaf", f"""
AT = {int(at)}
r, w = os.pipe()
fcntl.fcntl(w, 1031, 4096)
worker = real_worker(stdout=w, process_group=0)  # a signal to the rank's group misses it
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGTERM}})
os.close(w)
rc = None
for line in os.fdopen(r, "rb"):
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
    if b'"loss"' in line and json.loads(line).get("step", 0) >= AT and not os.path.exists(GATE):
        open(GATE + ".paused", "a").close()
        hold()
""")


def test_a_job_past_its_grace_is_stopped_and_restarts_from_its_checkpoint(make_server, work):
    # Checkpoints every 100 steps; the ranks are held once they have logged step 105 (they
    # run ahead of what their held stand-in passed on by what its pipe and its reader's
    # buffer hold, some 80 loss events at most, so their newest checkpoint is ckpt-100),
    # and the spec's grace, 1 s, passes meanwhile.
    deaf = Deaf(work / "stand", 105)
    srv = make_server(cpu_slots=2, env=deaf.env)
    write_tokens(srv)
    over = dict(steps=250, checkpoint={"every_steps": 100, "keep_last": 100})
    low = srv.submit(gpt_spec("deaf", priority=10, preempt_grace=1, **over))["id"]
    wait_until(lambda: os.path.exists(str(deaf.gate) + ".paused"), 120, "the deaf job paused at step 105")
    high = srv.submit(gpt_spec("high", priority=80, steps=5))["id"]
    hj = srv.wait_state(high, FINAL, timeout=300)
    assert hj["state"] == "succeeded", hj
    deaf.release()
    lj = srv.wait_state(low, FINAL, timeout=300)
    assert lj["state"] == "succeeded" and lj["restarts"] == 0 and lj["preemptions"] == 1, lj
    pre = [h for h in lj["restart_history"] if h.get("reason") == "preempted"]
    assert len(pre) == 1 and pre[0]["forced"] and pre[0]["by"] == high, lj["restart_history"]
    assert pre[0]["step"] == 100 and pre[0]["lost_steps"] >= 5, pre
    assert "losing" in pre[0]["message"] and "step 100" in pre[0]["message"], pre
    assert final_model(srv, low) == run_alone(srv, gpt_spec("alone", priority=10, **over))


def test_time_limit_cancels_the_job(make_server, work):
    stand = PausingAt(work / "stand", [10])
    srv = make_server(cpu_slots=2, env=stand.env)
    write_tokens(srv)
    jid = srv.submit(gpt_spec("limited", time_limit=1))["id"]
    j = srv.wait_state(jid, FINAL, timeout=120)
    stand.release()
    assert j["state"] == "cancelled" and j["error"].startswith("time_limit"), j
