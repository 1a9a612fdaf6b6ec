"""The server SIGKILLed in the middle of an asha sweep (some trials paused at rung 0, one
job queued or running, the rest pending) and started again on the same database: the
controller goes on from the store to the end, and decides as the rule says from the rung
records (synchronous successive halving, docs/api.md "Sweeps"): 9 trials -> 3 -> 1, every
trial with exactly one job per rung it ran (none submitted twice, none lost)."""
from pylib.server import wait_until

RUNGS = [20, 60, 180]


def spec():
    return {"name": "asha", "world_size": 1, "device": "cpu", "max_restarts": 1,
            "model": [{"type": "linear", "in": 4, "out": 16}, {"type": "relu"}, {"type": "linear", "in": 16, "out": 1}],
            "loss": "mse", "optimizer": {"type": "sgd", "lr": 0.01},
            "data": {"type": "synthetic", "samples": 64, "seed": 1},
            "eval": {"data": {"type": "synthetic", "samples": 32, "seed": 1}, "every_steps": 20},
            "batch_size": 4, "steps": 180, "log_every": 20, "init": {"seed": 1}}


def promoted(results, entered, rf=3):
    ranked = sorted((m, i) for i, m in results.items() if m is not None)
    return {i for _, i in ranked[:max(1, entered // rf)]}


def test_asha_sweep_goes_on_after_sigkill(make_server):
    srv = make_server(cpu_slots=1)
    body = {"spec": spec(), "method": "asha", "count": 9, "seed": 3, "metric": "eval_loss", "max_parallel": 1,
            "parameters": {"optimizer.lr": {"min": 0.001, "max": 0.1, "log": True}},
            "asha": {"min_steps": 20, "reduction_factor": 3, "max_steps": 180}}
    r = srv.post("/v1/sweeps", json=body)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]

    def midway():
        sw = srv.get(f"/v1/sweeps/{sid}").json()
        paused = sum(1 for t in sw["trials"] if t["state"] == "paused")
        return sw if sw["state"] == "running" and 2 <= paused < 9 else None
    wait_until(midway, 120, "some trials paused at rung 0, others not yet")
    srv.kill9()
    srv.start()

    sw = wait_until(lambda: (lambda s: s if s["state"] != "running" else None)(srv.get(f"/v1/sweeps/{sid}").json()),
                    300, f"sweep {sid} to end (stderr: {srv.stderr()[-600:]!r})")
    assert sw["state"] == "succeeded" and sw["counts"] == {"succeeded": 1, "stopped": 8}, sw
    trials = {t["index"]: t for t in sw["trials"]}
    at = {}
    for i, t in trials.items():
        for k, rec in enumerate(t["rungs"]):
            assert rec["rung"] == k and rec["step"] == RUNGS[k], t
            at.setdefault(k, {})[i] = rec["metric"]
    assert sorted(at[0]) == list(range(9))
    assert set(at[1]) == promoted(at[0], 9) and set(at[2]) == promoted(at[1], 3), at
    # One job per rung run, named after its trial, none twice.
    jobs = [j for j in srv.get("/v1/jobs", params={"limit": 100}).json()["jobs"]
            if j["name"].startswith(f"sweep-{sid}-")]
    want = sorted(rec["job"] for t in trials.values() for rec in t["rungs"])
    assert sorted(j["id"] for j in jobs) == want, (jobs, trials)
