"""ASHA sweeps (method "asha", server/sweep/sweep_asha.c): 9 trials of a fixed-seed MLP
promote exactly the trials that synchronous successive halving, written here from the
trials' own eval events at each rung, promotes; a promoted trial's losses after each
pause equal those of the same trial run as one job that never paused, bit for bit; the
trial's rungs list its chain of jobs, each resumed from the one before."""
import math

from pylib.server import wait_until
from test_sweeps import post_sweep, small, wait_sweep

RF = 3
RUNGS = [4, 12, 36]  # min_steps 4 * 3^k below max_steps 36, then 36


def mlp(**over):
    s = small(model=[{"type": "linear", "in": 4, "out": 8}, {"type": "relu"}, {"type": "linear", "in": 8, "out": 1}],
              eval={"data": {"type": "synthetic", "samples": 16, "seed": 2}, "every_steps": 4},
              init={"seed": 3}, optimizer={"type": "sgd", "lr": 0.01, "momentum": 0.5})
    s.update(over)
    return s


def events_of(server, job, kind):
    return {e["step"]: e["loss"] for e in server.events(job) if e.get("event") == kind}


def promoted_by_rule(results, entered):
    """Synchronous successive halving (docs/api.md "Sweeps"): of the trials that paused at
    the rung, the best max(1, entered // RF) by metric (min), ties by the lower index."""
    ranked = sorted((m, i) for i, m in results.items() if m is not None and math.isfinite(m))
    return {i for _, i in ranked[:max(1, entered // RF)]}


def test_asha_promotes_what_the_rule_says_and_resumes_bit_exact(server):
    body = {"spec": mlp(), "method": "asha", "count": 9, "seed": 11, "metric": "eval_loss", "mode": "min",
            "parameters": {"optimizer.lr": {"min": 0.002, "max": 0.2, "log": True}},
            "asha": {"min_steps": 4, "reduction_factor": RF, "max_steps": 36}, "max_parallel": 2}
    created = post_sweep(server, body)
    assert created["trials"] == 9 and created["method"] == "asha", created
    sw = wait_sweep(server, created["id"], timeout=300)
    trials = {t["index"]: t for t in sw["trials"]}
    assert len(trials) == 9

    # Every rung's record is its job's eval at the rung's step; the jobs chain by resume.
    at = {}  # rung -> {trial: metric}
    for i, t in trials.items():
        prev = None
        for k, r in enumerate(t["rungs"]):
            assert r["rung"] == k and r["step"] == RUNGS[k], t
            job = server.job(r["job"])
            assert job["tags"] == [f"sweep-{created['id']}"] and job["spec"]["steps"] == 36, job
            assert job["resumed_from"] == prev and job["resumed_from_step"] == (RUNGS[k - 1] if k else None), job
            if k < len(RUNGS) - 1:
                assert job["state"] == "succeeded" and job["stop_reason"] == f"paused at step {RUNGS[k]}", job
            evals = events_of(server, r["job"], "eval")
            assert max(evals) == RUNGS[k] and r["metric"] == evals[RUNGS[k]], (r, evals)
            at.setdefault(k, {})[i] = r["metric"]
            prev = r["job"]
        assert t["job"] == prev and t["rung"] == len(t["rungs"]) - 1, t

    # The rule, from the rung metrics: exactly those trials went on.
    assert sorted(at[0]) == list(range(9))
    want1 = promoted_by_rule(at[0], 9)
    assert set(at.get(1, {})) == want1 and len(want1) == 3, (at, want1)
    want2 = promoted_by_rule(at[1], 3)
    assert set(at.get(2, {})) == want2 and len(want2) == 1, (at, want2)
    (winner,) = want2
    for i, t in trials.items():
        assert t["state"] == ("succeeded" if i == winner else "stopped"), (i, t)
    # Ranked: the most rungs first, then by metric; the best is the one that finished.
    assert sw["trials"][0]["index"] == winner and sw["best"]["index"] == winner, sw
    assert sw["counts"] == {"succeeded": 1, "stopped": 8}, sw["counts"]

    # ddpd sweep show: a RUNG column, the winner first at the last rung.
    import os
    import subprocess

    from pylib.common import bin_dir
    r = subprocess.run([str(bin_dir() / "ddpd"), "sweep", "show", str(created["id"])], capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, DDPD_SERVER=server.url))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].split() == ["RANK", "TRIAL", "JOB", "STATE", "METRIC", "RUNG", "VALUES"], lines
    assert lines[2].split()[:4] == ["1", str(winner), str(trials[winner]["job"]), "succeeded"], lines
    assert lines[2].split()[5] == "2", lines

    # The winner's spec run as one job that never paused: the same losses, bit for bit.
    spec = dict(sw["best"]["spec"], name="unpaused")
    r = server.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    straight = r.json()["id"]
    wait_until(lambda: server.job(straight)["state"] in ("succeeded", "failed"), 120, "the unpaused job")
    assert server.job(straight)["state"] == "succeeded"
    want_loss, want_eval = events_of(server, straight, "loss"), events_of(server, straight, "eval")
    got_loss, got_eval = {}, {}
    for r in trials[winner]["rungs"]:
        got_loss.update(events_of(server, r["job"], "loss"))
        got_eval.update(events_of(server, r["job"], "eval"))
    assert sorted(got_loss) == sorted(want_loss) == list(range(1, 37)), (sorted(got_loss), sorted(want_loss))
    assert got_loss == want_loss and got_eval == want_eval


def test_bad_asha_requests_are_422_naming_the_key(server):
    base = {"spec": mlp(), "method": "asha", "count": 3, "metric": "eval_loss",
            "parameters": {"optimizer.lr": [0.01, 0.1]}, "asha": {"min_steps": 4, "max_steps": 36}}

    def bad(path, needle, **over):
        r = server.post("/v1/sweeps", json={**base, **over})
        assert r.status_code == 422, r.text
        e = r.json()["error"]
        assert e["path"] == path and needle in e["message"], e

    bad("asha", "required", asha=None)
    bad("asha.max_steps", "more than min_steps", asha={"min_steps": 4, "max_steps": 4})
    bad("asha.reduction_factor", "2..64", asha={"min_steps": 4, "max_steps": 36, "reduction_factor": 1})
    bad("asha", 'unknown key "eta"', asha={"min_steps": 4, "max_steps": 36, "eta": 3})
    bad("asha.min_steps", "not an eval step", asha={"min_steps": 3, "max_steps": 36})
    bad("metric", "needs the spec's eval", spec=small())
    bad('parameters["steps"]', "asha sets every trial's steps", parameters={"steps": [4, 8]})
    bad("asha", "only for method", method="random")
    assert server.get("/v1/sweeps").json()["sweeps"] == []


def test_cancel_ends_the_promoted_trials_job_and_keeps_the_stopped(server):
    """3 trials, rungs 4, 256, 16384, 1048576 and a max_steps no test outlives: after rung 0
    one trial goes on alone; at its last rung (a job that runs until cancelled) the cancel
    ends its job, and the stopped trials stay stopped."""
    from pylib.server import FOREVER_STEPS
    body = {"spec": mlp(log_every=1000), "method": "asha", "metric": "loss", "max_parallel": 1,
            "parameters": {"optimizer.lr": [0.01, 0.02, 0.03]},
            "asha": {"min_steps": 4, "reduction_factor": 64, "max_steps": FOREVER_STEPS}}
    sid = post_sweep(server, body)["id"]

    def promoted_running():
        ts = server.get(f"/v1/sweeps/{sid}").json()["trials"]
        on = [t for t in ts if t["rung"] == 4 and t["state"] == "running"]
        return (on[0], ts) if on and sum(t["state"] == "stopped" for t in ts) == 2 else None
    t, _ = wait_until(promoted_running, 120, "one trial at its last rung and running, two stopped")
    r = server.post(f"/v1/sweeps/{sid}/cancel")
    assert r.status_code == 202, r.text
    server.wait_state(t["job"], "cancelled")
    sw = server.get(f"/v1/sweeps/{sid}").json()
    assert sw["state"] == "cancelled", sw
    assert sorted(x["state"] for x in sw["trials"]) == ["cancelled", "stopped", "stopped"], sw["trials"]
    assert server.post(f"/v1/sweeps/{sid}/cancel").status_code == 409
    # The sweep's jobs: one per rung record (paused), and the cancelled one (none made since).
    jobs = sorted(j["id"] for j in server.get("/v1/jobs", params={"tag": f"sweep-{sid}"}).json()["jobs"])
    recorded = [rec["job"] for x in sw["trials"] for rec in x["rungs"]]
    assert jobs == sorted(recorded + [t["job"]]), (jobs, sw["trials"])
    assert [x["job"] for x in sw["trials"] if x["state"] == "cancelled"] == [t["job"]]
