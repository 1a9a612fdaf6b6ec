"""Sweeps (POST /v1/sweeps, server/sweep/): a grid makes exactly its product of jobs with
those values, never more than max_parallel at once, ranked by the metric with the best
trial's spec; the random method draws the documented generator's values (splitmix64,
reimplemented here); bad parameter paths and values that make a bad spec are 422s naming
the path or the trial, and store nothing; a cancel ends the running job and the pending
trials."""
import math

from pylib.server import FOREVER_STEPS, seed_spec, wait_until

FINAL = ("succeeded", "failed", "cancelled")


def small(**over):
    s = seed_spec(name="base", epochs=None, steps=6, log_every=1,
                  model=[{"type": "linear", "in": 4, "out": 3}, {"type": "relu"}, {"type": "linear", "in": 3, "out": 1}],
                  data={"type": "synthetic", "samples": 24, "seed": 1}, batch_size=2)
    s.update(over)
    return s


def post_sweep(server, body, expect=201):
    r = server.post("/v1/sweeps", json=body)
    assert r.status_code == expect, r.text
    return r.json()


def wait_sweep(server, sid, states=("succeeded",), timeout=120):
    def done():
        sw = server.get(f"/v1/sweeps/{sid}").json()
        return sw if sw["state"] in states else None
    return wait_until(done, timeout, f"sweep {sid} to reach {states} (stderr: {server.stderr()[-600:]!r})")


def test_grid_2x2_makes_exactly_those_jobs(server):
    body = {"spec": small(), "parameters": {"optimizer.lr": [0.01, 0.05], "batch_size": [2, 3]},
            "method": "grid", "metric": "loss", "mode": "min", "max_parallel": 2}
    created = post_sweep(server, body)
    assert created["trials"] == 4 and created["state"] == "running", created
    sid = created["id"]
    sw = wait_sweep(server, sid)
    trials = sw["trials"]
    assert len(trials) == 4 and sw["counts"] == {"succeeded": 4}, sw
    # The product, in the documented order: paths sorted, the last one changing fastest.
    by_index = sorted(trials, key=lambda t: t["index"])
    assert [t["params"] for t in by_index] == [
        {"batch_size": 2, "optimizer.lr": 0.01}, {"batch_size": 2, "optimizer.lr": 0.05},
        {"batch_size": 3, "optimizer.lr": 0.01}, {"batch_size": 3, "optimizer.lr": 0.05}]
    jobs = server.get("/v1/jobs", params={"limit": 100}).json()["jobs"]
    mine = [j for j in jobs if j["name"].startswith(f"sweep-{sid}-")]
    assert sorted(j["id"] for j in mine) == sorted(t["job"] for t in trials), (mine, trials)
    # Tagged with the sweep: the tag filter lists exactly them.
    tagged = server.get("/v1/jobs", params={"tag": f"sweep-{sid}"}).json()["jobs"]
    assert sorted(j["id"] for j in tagged) == sorted(j["id"] for j in mine), tagged
    spans = []
    for t in trials:
        j = server.job(t["job"])
        assert j["state"] == "succeeded" and j["name"] == f"sweep-{sid}-{t['index']}", j
        assert j["tags"] == [f"sweep-{sid}"], j
        assert j["spec"]["optimizer"]["lr"] == t["params"]["optimizer.lr"], j["spec"]
        assert j["spec"]["batch_size"] == t["params"]["batch_size"], j["spec"]
        # The metric "loss" is the job's last step's mean loss.
        assert t["metric"] == j["loss"], (t, j)
        spans.append((j["created_at"], j["finished_at"]))
    # max_parallel 2: a trial's job is made only after an earlier one ended, so at no
    # moment were more than 2 of them between their creation and their end.
    for start, _ in spans:
        assert sum(1 for s, f in spans if s <= start < f) <= 2, spans
    # Ranked by the metric (min), the best the first, with its spec.
    metrics = [t["metric"] for t in trials]
    assert metrics == sorted(metrics) and [t["rank"] for t in trials] == [1, 2, 3, 4], trials
    best = sw["best"]
    assert best["job"] == trials[0]["job"] and best["metric"] == metrics[0], best
    assert best["spec"]["optimizer"]["lr"] == best["params"]["optimizer.lr"], best
    assert sw["request"]["parameters"] == body["parameters"], sw["request"]
    listed = server.get("/v1/sweeps").json()["sweeps"]
    assert [(s["id"], s["state"], s["trials"]) for s in listed] == [(sid, "succeeded", 4)], listed


M64 = (1 << 64) - 1


def splitmix(seed):
    """docs/api.md's generator: splitmix64 from the seed, a number in [0, 1) from the top 53 bits."""
    state = seed
    while True:
        state = (state + 0x9E3779B97F4A7C15) & M64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        yield ((z ^ (z >> 31)) >> 11) * 2.0 ** -53


def expected_random(params, count, seed):
    rng = splitmix(seed)
    out = []
    for _ in range(count):
        t = {}
        for path in sorted(params):
            p, u = params[path], next(rng)
            if isinstance(p, list):
                t[path] = p[min(int(u * len(p)), len(p) - 1)]
            elif p.get("type") == "int":
                lo, hi = p["min"], p["max"] + 1
                x = math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))) if p.get("log") else lo + u * (hi - lo)
                t[path] = int(min(max(math.floor(x), p["min"]), p["max"]))
            else:
                lo, hi = p["min"], p["max"]
                x = math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))) if p.get("log") else lo + u * (hi - lo)
                t[path] = min(max(x, lo), hi)
        out.append(t)
    return out


def test_random_draws_the_documented_generator(server):
    params = {"optimizer.lr": {"min": 0.001, "max": 0.1, "log": True},
              "batch_size": {"min": 1, "max": 4, "type": "int"},
              "optimizer.momentum": [0.0, 0.5, 0.9]}
    body = {"spec": small(optimizer={"type": "sgd", "lr": 0.01, "momentum": 0.0}), "parameters": params,
            "method": "random", "count": 6, "seed": 7, "max_parallel": 3, "metric": "loss"}
    sid = post_sweep(server, body)["id"]
    sw = wait_sweep(server, sid)
    got = [t["params"] for t in sorted(sw["trials"], key=lambda t: t["index"])]
    want = expected_random(params, 6, 7)
    assert len(got) == 6
    for g, w in zip(got, want):
        assert g.keys() == w.keys() and g["batch_size"] == w["batch_size"], (g, w)
        assert g["optimizer.momentum"] == w["optimizer.momentum"], (g, w)
        assert math.isclose(g["optimizer.lr"], w["optimizer.lr"], rel_tol=1e-15), (g, w)
        assert 0.001 <= g["optimizer.lr"] <= 0.1 and 1 <= g["batch_size"] <= 4
    # The same seed draws the same trials.
    again = post_sweep(server, body)["id"]
    assert [t["params"] for t in sorted(server.get(f"/v1/sweeps/{again}").json()["trials"],
                                        key=lambda t: t["index"])] == got
    wait_sweep(server, again)


def test_bad_paths_and_values_are_422_naming_them(server):
    base = small()

    def bad(parameters, path, needle, **extra):
        body = {"spec": base, "parameters": parameters, "method": "grid", **extra}
        r = server.post("/v1/sweeps", json=body)
        assert r.status_code == 422, r.text
        e = r.json()["error"]
        assert e["path"] == path and needle in e["message"], e

    bad({"optimizer.lrr": [0.1]}, 'parameters["optimizer.lrr"]', 'no key "lrr" in optimizer')
    bad({"model[7].out": [2]}, 'parameters["model[7].out"]', "model has 3 items, no [7]")
    bad({"optimizer.lr.x": [2]}, 'parameters["optimizer.lr.x"]', "optimizer.lr is not an object")
    bad({"batch_size[0]": [2]}, 'parameters["batch_size[0]"]', "batch_size is not a list")
    bad({"optimizer.lr": [0.1, -1]}, "trials[1]", "optimizer.lr")
    bad({"optimizer.lr": {"min": 0.1, "max": 1}}, 'parameters["optimizer.lr"]', "a grid needs a list")
    bad({"optimizer.lr": []}, 'parameters["optimizer.lr"]', "expected a list of 1..")
    bad({"optimizer lr": [1]}, "parameters", "letters, digits")
    bad({"optimizer.lr": [0.1]}, "asha", 'required for method "asha"', method="asha")
    r = server.post("/v1/sweeps", json={"spec": dict(base, loss="nope"), "parameters": {"optimizer.lr": [1]},
                                         "method": "grid"})
    assert r.status_code == 422 and r.json()["error"]["path"] == "spec.loss", r.text
    r = server.post("/v1/sweeps", json={"spec": base, "parameters": {"optimizer.lr": {"min": 0, "max": 1,
                                                                                     "log": True}},
                                         "method": "random", "count": 2})
    assert r.status_code == 422 and "log: expected min > 0" in r.json()["error"]["message"], r.text
    r = server.post("/v1/sweeps", json={"spec": base, "parameters": {"optimizer.lr": [1]}, "method": "random"})
    assert r.status_code == 422 and r.json()["error"]["path"] == "count", r.text
    r = server.post("/v1/sweeps", json={"spec": base, "parameters": {"optimizer.lr": [1]}, "method": "grid",
                                         "speed": 1})
    assert r.status_code == 422 and r.json()["error"]["path"] == "speed", r.text
    assert server.get("/v1/sweeps").json()["sweeps"] == []
    assert server.get("/v1/jobs").json()["jobs"] == []
    assert server.get("/v1/sweeps/99").status_code == 404
    assert server.post("/v1/sweeps/99/cancel").status_code == 404
    assert server.get("/v1/sweeps", params={"state": "bogus"}).status_code == 400


def test_cancel_ends_the_running_job_and_the_pending_trials(server):
    body = {"spec": small(steps=FOREVER_STEPS, log_every=1000), "parameters": {"optimizer.lr": [0.01, 0.02, 0.03]},
            "method": "grid", "max_parallel": 1}
    sid = post_sweep(server, body)["id"]

    def first_job():
        t = [t for t in server.get(f"/v1/sweeps/{sid}").json()["trials"] if t["job"]]
        return t[0]["job"] if t else None
    job = wait_until(first_job, 60, "the first trial's job")
    server.wait_running(job)
    r = server.post(f"/v1/sweeps/{sid}/cancel")
    assert r.status_code == 202, r.text
    server.wait_state(job, "cancelled")
    sw = server.get(f"/v1/sweeps/{sid}").json()
    assert sw["state"] == "cancelled" and sw["finished_at"] is not None, sw
    assert sorted((t["index"], t["state"], t["job"] is not None) for t in sw["trials"]) == [
        (0, "cancelled", True), (1, "cancelled", False), (2, "cancelled", False)], sw["trials"]
    assert sw["best"] is None
    r = server.post(f"/v1/sweeps/{sid}/cancel")
    assert r.status_code == 409, r.text
    assert len([j for j in server.get("/v1/jobs").json()["jobs"] if j["name"].startswith(f"sweep-{sid}-")]) == 1


def test_cli_sweep_submit_show_cancel(server, work):
    """`ddpd sweep submit FILE` prints the id, `show` the ranked table and the best, `cancel`
    cancels; a bad path is exit 2 naming it."""
    import json
    import os
    import subprocess

    from pylib.common import bin_dir

    def cli(*args):
        env = dict(os.environ, DDPD_SERVER=server.url)
        env.pop("DDPD_TOKEN", None)
        return subprocess.run([str(bin_dir() / "ddpd"), "sweep", *args], env=env, capture_output=True, text=True,
                              timeout=60)

    f = work / "sweep.json"
    f.write_text(json.dumps({"spec": small(), "parameters": {"optimizer.lr": [0.01, 0.05]}, "method": "grid",
                             "metric": "loss"}))
    r = cli("submit", str(f))
    assert r.returncode == 0 and "2 trials" in r.stderr, (r.stdout, r.stderr)
    sid = int(r.stdout)
    sw = wait_sweep(server, sid)
    r = cli("show", str(sid))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"sweep {sid}: succeeded, grid, loss (min)"), lines
    assert lines[1].split() == ["RANK", "TRIAL", "JOB", "STATE", "METRIC", "VALUES"], lines
    first = lines[2].split()
    t0 = sw["trials"][0]
    assert first[:4] == ["1", str(t0["index"]), str(t0["job"]), "succeeded"], lines
    assert lines[-1].startswith(f"best: trial {t0['index']} (job {t0['job']}), loss = "), lines
    r = cli("show", "--json", str(sid))
    assert r.returncode == 0 and json.loads(r.stdout)["best"]["job"] == t0["job"], r.stdout
    r = cli("cancel", str(sid))
    assert r.returncode == 1 and f"sweep {sid} is succeeded" in r.stderr, (r.returncode, r.stderr)
    f.write_text(json.dumps({"spec": small(), "parameters": {"optimizer.lrr": [1]}, "method": "grid"}))
    r = cli("submit", str(f))
    assert r.returncode == 2 and 'parameters["optimizer.lrr"]' in r.stderr, r.stderr
    r = cli("bogus")
    assert r.returncode == 2 and "expected submit, show or cancel" in r.stderr, r.stderr


def test_trial_zero_files_and_fit_are_checked_at_submit(server):
    """Trial 0's data files are read by a planner at submit, as a job's are: a missing file
    is a 422 naming trial 0 and the file, and nothing is stored; present files pass and
    the trials run. A trial the server could never run (more ranks than slots) is a 422
    naming that trial."""
    import numpy as np

    rng = np.random.default_rng(0)
    np.save(server.data_dir / "x.npy", rng.standard_normal((16, 4)).astype(np.float32))
    np.save(server.data_dir / "y.npy", rng.standard_normal((16, 1)).astype(np.float32))
    files = small(data={"type": "npy", "x": "x.npy", "y": "y.npy"})
    r = server.post("/v1/sweeps", json={"spec": dict(files, data={"type": "npy", "x": "nope.npy", "y": "y.npy"}),
                                         "parameters": {"optimizer.lr": [0.01, 0.02]}, "method": "grid"})
    assert r.status_code == 422, r.text
    e = r.json()["error"]
    assert e["path"] == "trials[0]" and "nope.npy" in e["message"], e
    assert e["message"].startswith('trial 0 {"optimizer.lr":0.01}: data'), e
    r = server.post("/v1/sweeps", json={"spec": small(), "parameters": {"world_size": [1, 3]}, "method": "grid"})
    assert r.status_code == 422, r.text
    e = r.json()["error"]
    assert e["path"] == "trials[1]" and e["message"].startswith('trial 1 {"world_size":3}: world_size'), e
    assert server.get("/v1/sweeps").json()["sweeps"] == []
    sid = post_sweep(server, {"spec": files, "parameters": {"optimizer.lr": [0.01, 0.02]}, "method": "grid",
                              "metric": "loss", "max_parallel": 2})["id"]
    sw = wait_sweep(server, sid)
    assert sw["counts"] == {"succeeded": 2}, sw
