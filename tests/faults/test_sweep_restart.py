"""The server SIGKILLed in the middle of a sweep (a trial's job running, others pending)
and started again on the same database: the controller goes on with the sweep from the
store, to its end. Every trial ends succeeded with exactly one job (no trial submitted
twice, none lost), and the sweep is succeeded."""
from pylib.server import heavy_spec, wait_until

TRIALS = 4


def test_sweep_goes_on_after_sigkill(make_server):
    srv = make_server(cpu_slots=1)
    # Long enough that the kill finds trial 1 running (it is killed while running: the
    # wait below sees it so), short enough to finish; max_restarts 1 lets the supervisor
    # restart the job the kill interrupted.
    base = heavy_spec(1, steps=200_000, name="sw", max_restarts=1)
    body = {"spec": base, "parameters": {"optimizer.lr": [0.01, 0.02, 0.03, 0.04]}, "method": "grid",
            "metric": "loss", "max_parallel": 1}
    r = srv.post("/v1/sweeps", json=body)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]

    def second_running():
        ts = {t["index"]: t for t in srv.get(f"/v1/sweeps/{sid}").json()["trials"]}
        return ts[1]["job"] if ts[1]["job"] and srv.job(ts[1]["job"])["state"] == "running" else None
    job = wait_until(second_running, 120, "trial 1's job running")
    srv.kill9()
    srv.start()

    def ended():
        sw = srv.get(f"/v1/sweeps/{sid}").json()
        return sw if sw["state"] != "running" else None
    sw = wait_until(ended, 300, f"sweep {sid} to end (stderr: {srv.stderr()[-600:]!r})")
    assert sw["state"] == "succeeded" and sw["counts"] == {"succeeded": TRIALS}, sw
    jobs = [j for j in srv.get("/v1/jobs", params={"limit": 100}).json()["jobs"] if j["name"].startswith(f"sweep-{sid}-")]
    assert sorted(j["name"] for j in jobs) == [f"sweep-{sid}-{i}" for i in range(TRIALS)], jobs
    assert sorted(t["job"] for t in sw["trials"]) == sorted(j["id"] for j in jobs)
    # The interrupted job was restarted by the supervisor, not submitted again.
    j = srv.job(job)
    assert j["state"] == "succeeded" and j["restarts"] == 1, j
    assert all(t["metric"] is not None for t in sw["trials"]), sw["trials"]
