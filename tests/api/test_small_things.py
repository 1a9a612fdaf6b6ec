"""The small things of issue 19 part 4, each through the real server: error messages that
say what happened and where, query parameters that are checked, the server's options,
and /metrics."""
import socket
import subprocess

import pytest

from pylib.server import seed_spec

FINAL = ("succeeded", "failed", "cancelled")


def err_of(r, status):
    assert r.status_code == status, f"{r.status_code} {r.text}"
    return r.json()["error"]


def test_metrics_max_points_is_a_bound(server):
    jid = server.submit(seed_spec(name="curve", epochs=None, steps=50, log_every=1))["id"]
    assert server.wait_state(jid, FINAL)["state"] == "succeeded"
    for mp in (2, 3, 4, 5, 10):
        m = server.get(f"/v1/jobs/{jid}/metrics", params={"max_points": mp}).json()
        for s in [m["mean"]] + m["ranks"]:
            assert 2 <= len(s["step"]) <= mp, (mp, s)
            assert s["step"][0] == 1 and s["step"][-1] == 50, (mp, s)
    m = server.get(f"/v1/jobs/{jid}/metrics", params={"max_points": 2}).json()
    assert m["mean"]["step"] == [1, 50], m


def test_a_cuda_job_on_a_server_without_gpus_is_blamed_on_device(server):
    e = err_of(server.post("/v1/jobs", json=seed_spec(device="cuda")), 422)
    assert e["path"] == "device", e
    assert e["message"] == "device cuda: this server has no GPUs", e
    # A world too large for the slots there are is the world size's fault.
    e = err_of(server.post("/v1/jobs", json=seed_spec(world_size=3)), 422)
    assert e["path"] == "world_size" and "needs 3" in e["message"], e


def test_a_data_path_that_is_the_data_directory_says_so(server):
    (server.data_dir / "sub").mkdir()
    for x in (".", "./", "./.", "sub/.."):
        e = err_of(server.post("/v1/jobs", json=seed_spec(data={"type": "npy", "x": x, "y": "y.npy"})), 422)
        assert e["path"] == "data.x", (x, e)
        assert "symbolic link" not in e["message"], (x, e)
        if x != "sub/..":
            assert e["message"] == f'data.x: "{x}" is the data directory itself; name a file in it', (x, e)
    # Messages name files as the spec does, relative to the data directory.
    e = err_of(server.post("/v1/jobs", json=seed_spec(data={"type": "npy", "x": "sub", "y": "y.npy"})), 422)
    assert e["message"] == "sub: not a regular file" and str(server.data_dir) not in e["message"], e


def test_unknown_query_parameters_are_refused_naming_them(server):
    jid = server.submit(seed_spec(name="q"))["id"]
    e = err_of(server.get("/v1/jobs?nmae=x"), 400)
    assert e["code"] == "bad_query" and e["path"] == "nmae", e
    assert e["message"] == "unknown query parameter 'nmae' (GET /v1/jobs takes state, limit, before, name, tag)", e
    e = err_of(server.get(f"/v1/jobs/{jid}/metrics?max_point=2&x=1"), 400)
    assert e["message"].startswith("unknown query parameters 'max_point', 'x' (GET /v1/jobs/{id}/metrics takes "
                                   "max_points)"), e
    e = err_of(server.get(f"/v1/jobs/{jid}?verbose=1"), 400)
    assert "takes none" in e["message"], e
    e = err_of(server.post(f"/v1/jobs/{jid}/cancel?force=1"), 400)
    assert "'force'" in e["message"], e
    for path in (f"/v1/jobs/{jid}/logs?rank=0&tail=5", f"/v1/jobs/{jid}/metrics?max_points=10",
                 "/v1/jobs?state=queued,succeeded&limit=5", f"/v1/jobs/{jid}/checkpoints"):
        assert server.get(path).status_code in (200, 404), path


def test_a_query_parameter_given_twice_or_with_a_nul_byte_is_refused(server):
    """Issue 28 item 7: `?step=10&step=4` served step 10 and `?file=model%00` the model
    (a handler read the first value, and a value only up to its NUL). Both are a 400 naming
    the parameter, on every route, before its handler runs; so is a NUL in the path, which
    ended it early (`DELETE /v1/jobs/ID%00x` deleted job ID)."""
    jid = server.submit(seed_spec(name="alpha", world_size=1, epochs=None, steps=20, log_every=1,
                                  checkpoint={"every_steps": 10}))["id"]
    assert server.wait_state(jid, FINAL)["state"] == "succeeded"
    twice = [
        ("GET", f"/v1/jobs/{jid}/checkpoint?step=10&step=4", "step", "twice"),
        ("GET", f"/v1/jobs/{jid}/checkpoint?step=10&file=model&file=optim", "file", "twice"),
        ("GET", "/v1/jobs?state=running&state=succeeded", "state", "twice"),
        ("GET", "/v1/jobs?limit=5&name=alpha&limit=5&limit=5", "limit", "3 times"),
        ("GET", f"/v1/jobs/{jid}/logs?rank=0&tail=5&tail=6", "tail", "twice"),
        ("GET", f"/v1/jobs/{jid}/metrics?max_points=10&max_points=20", "max_points", "twice"),
        ("POST", f"/v1/jobs/{jid}/resume?step=10&step=10", "step", "twice"),
        ("GET", "/healthz?x=1&x=2", "x", "twice"),
    ]
    for method, path, name, how in twice:
        e = err_of(server.request(method, path), 400)
        assert e["code"] == "bad_query" and e["path"] == name, (path, e)
        assert e["message"] == f"query parameter '{name}' is given {how}; give it once", (path, e)
    nul = [
        ("GET", f"/v1/jobs/{jid}/checkpoint?step=10&file=model%00", "file"),
        ("GET", "/v1/jobs?name=alpha%00", "name"),
        ("GET", f"/v1/jobs/{jid}/logs?rank=0%00", "rank"),
        ("GET", "/metrics?x=%00", "x"),
    ]
    for method, path, name in nul:
        e = err_of(server.request(method, path), 400)
        assert e["code"] == "bad_query" and e["path"] == name, (path, e)
        assert e["message"] == f"query parameter '{name}' contains a NUL byte (%00) in its value", (path, e)
    for method, path in (("GET", f"/v1/jobs/{jid}%00/checkpoints"), ("DELETE", f"/v1/jobs/{jid}%00x")):
        e = err_of(server.request(method, path), 400)
        assert e["code"] == "bad_request", (path, e)
        assert e["message"] == "the request path contains a NUL byte (%00)", (path, e)
    # Without the faults the same requests are answered; the DELETE above deleted nothing.
    assert server.get(f"/v1/jobs/{jid}/checkpoint?step=10&file=model").status_code == 200
    assert [j["id"] for j in server.get("/v1/jobs?name=alpha").json()["jobs"]] == [jid]


def test_the_job_list_filters_by_name(server):
    a = server.submit(seed_spec(name="alpha"))["id"]
    b = server.submit(seed_spec(name="beta"))["id"]
    c = server.submit(seed_spec(name="alpha"))["id"]
    assert [j["id"] for j in server.get("/v1/jobs?name=alpha").json()["jobs"]] == [c, a]
    assert [j["id"] for j in server.get("/v1/jobs?name=beta").json()["jobs"]] == [b]
    assert server.get("/v1/jobs?name=alp").json()["jobs"] == []  # exact, not a prefix
    assert [j["id"] for j in server.get("/v1/jobs?name=alpha&limit=1").json()["jobs"]] == [c]
    r = server.get("/v1/jobs", params={"name": "alpha", "limit": 1}).json()
    assert [j["id"] for j in server.get("/v1/jobs", params={"name": "alpha", "before": r["next"]}).json()["jobs"]] == [a]
    for st in ("queued,starting,running,succeeded", "succeeded"):
        server.wait_state(c, FINAL)
        server.wait_state(a, FINAL)
        assert [j["id"] for j in server.get("/v1/jobs", params={"name": "alpha", "state": st}).json()["jobs"]] == [c, a]
    assert len(server.get("/v1/jobs?name=").json()["jobs"]) == 3  # empty: no filter
    e = err_of(server.get("/v1/jobs", params={"name": "x" * 200}), 400)
    assert e["path"] == "name", e


def serve_fails(work, *args, timeout=30):
    from pylib.server import bin_dir
    r = subprocess.run([str(bin_dir() / "ddpd"), "serve", "--gpus", "none", "--data-dir", str(work), *args],
                       capture_output=True, text=True, timeout=timeout, cwd=str(work))
    return r.returncode, r.stderr


@pytest.mark.parametrize("addr", ["localhost:0", "127.1:0", "LOCALHOST:0"])
def test_loopback_names_are_loopback(make_server, addr):
    # Without a token a non-loopback address is refused: these start.
    srv = make_server(extra=["--listen", addr])
    assert srv.get("/v1/jobs").status_code == 200


def test_bad_listen_addresses_say_what_is_wrong(work):
    rc, err = serve_fails(work, "--listen", "127.0.0.1:99999", "--db", str(work / "x.db"))
    assert rc == 2 and 'port "99999" is not a number from 0 to 65535' in err, err
    assert "token" not in err, err
    rc, err = serve_fails(work, "--listen", "example.com:8080", "--db", str(work / "x.db"))
    assert rc == 2 and "host names are not looked up" in err, err
    rc, err = serve_fails(work, "--listen", "0.0.0.0:0", "--db", str(work / "x.db"))
    assert rc == 2 and "refusing to listen" in err, err  # the token rule, for a real non-loopback address
    assert sorted(p.name for p in work.iterdir()) == [], list(work.iterdir())


def test_db_in_a_missing_folder_is_refused_and_a_failed_start_leaves_nothing(work):
    rc, err = serve_fails(work, "--listen", "127.0.0.1:0", "--db", str(work / "no" / "dir" / "x.db"))
    assert rc == 2, err
    assert f"--db {work}/no/dir/x.db: the folder {work}/no/dir does not exist; create it first" in err, err
    assert not (work / "no").exists()
    # A start that fails after the database was opened (the port taken) leaves no new one.
    (work / "d").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        rc, err = serve_fails(work, "--listen", f"127.0.0.1:{s.getsockname()[1]}", "--db", str(work / "d" / "x.db"))
    assert rc == 1 and "in use" in err, err
    assert list((work / "d").iterdir()) == [], list((work / "d").iterdir())


def test_the_job_list_knows_the_total_of_an_epoch_job_on_file_data(server):
    import numpy as np
    np.save(server.data_dir / "x.npy", np.zeros((100, 10), np.float32))
    np.save(server.data_dir / "y.npy", np.zeros((100, 5), np.float32))
    spec = seed_spec(name="files", world_size=2, epochs=3, batch_size=7, grad_accum=2,
                     data={"type": "npy", "x": "x.npy", "y": "y.npy"})
    jid = server.submit(spec)["id"]
    # 50 rows a rank, 8 micro-batches of 7, 4 optimizer steps an epoch, 3 epochs.
    assert server.job(jid)["total_steps"] == 12
    listed = {j["id"]: j for j in server.get("/v1/jobs").json()["jobs"]}
    assert listed[jid]["total_steps"] == 12
    j = server.wait_state(jid, FINAL)
    assert j["state"] == "succeeded" and j["step"] == 12, j
    assert server.submit(seed_spec(epochs=None, steps=40))["total_steps"] == 40
    assert server.submit(seed_spec(epochs=2))["total_steps"] == 2000  # 3000 samples, batch 3
    # Files with {rank}: only the ranks can count them.
    for r in range(2):
        np.save(server.data_dir / f"x-{r}.npy", np.zeros((10, 10), np.float32))
        np.save(server.data_dir / f"y-{r}.npy", np.zeros((10, 5), np.float32))
    r = server.submit(seed_spec(world_size=2, data={"type": "npy", "x": "x-{rank}.npy", "y": "y-{rank}.npy"}))
    assert r["total_steps"] is None, r


def metrics(server):
    out = {}
    for line in server.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def test_prometheus_metrics_one_name_per_concept(server):
    from pylib.server import FOREVER_STEPS, heavy_spec, wait_until
    done = server.submit(seed_spec(name="done"))["id"]
    server.wait_state(done, FINAL)
    jid = server.submit(heavy_spec(2, steps=FOREVER_STEPS, name='run "x"', log_every=10))["id"]
    server.wait_running(jid)
    wait_until(lambda: server.job(jid)["step"], 30, "a step")
    m = metrics(server)
    assert m['ddpd_build_info{version="0.1.0"}'] == 1, m
    assert m['ddpd_jobs{state="running"}'] == 1 and m['ddpd_jobs{state="queued"}'] == 0, m
    assert not [k for k in m if k.startswith("ddpd_jobs{") and "succeeded" in k], m
    assert m['ddpd_slots{kind="cpu"}'] == 2 and m['ddpd_slots_used{kind="cpu"}'] == 2, m
    assert m['ddpd_slots{kind="cuda"}'] == 0 and m['ddpd_slots_used{kind="cuda"}'] == 0, m
    key = f'ddpd_job_step{{job="{jid}",name="run \\"x\\""}}'
    assert m[key] >= 1, m
    assert f'ddpd_job_loss{{job="{jid}",name="run \\"x\\""}}' in m, m
    assert not [k for k in m if k.startswith("ddpd_job_step") and f'job="{done}"' in k], m
    # The streams: one name each for the open ones and the dropped ones.
    assert "ddpd_stream_subscribers" in m and "ddpd_stream_subscribers_dropped_total" in m, m
    assert not [k for k in m if k.startswith("ddpd_http_streams")], m
    assert server.post(f"/v1/jobs/{jid}/cancel").status_code == 202
    server.wait_state(jid, FINAL)
    m = metrics(server)
    assert m['ddpd_slots_used{kind="cpu"}'] == 0 and not [k for k in m if k.startswith("ddpd_job_step{")], m


def test_error_messages_show_no_server_paths(make_server, work):
    # A dashboard file that is not there: open to anyone, so no server folder in it.
    web = work / "web"
    web.mkdir()
    (web / "index.html").write_text("<html></html>")
    server = make_server(extra=["--web-dir", str(web)])
    r = server.get("/web/app.js")
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "no such resource: /web/app.js (not in the dashboard's folder, --web-dir)", r.text
    e = err_of(server.post("/v1/jobs", json=seed_spec(data={"type": "npy", "x": "x.npy", "y": "y.npy"})), 422)
    assert str(server.data_dir) not in e["message"] and e["message"] == "x.npy: cannot open: No such file or directory", e


def test_a_failed_jobs_error_shows_no_server_paths(make_server):
    srv = make_server(extra=["--job-disk-quota", "1K"])
    jid = srv.submit(seed_spec(name="big", epochs=None, steps=20, checkpoint={"every_steps": 5}))["id"]
    j = srv.wait_state(jid, FINAL)
    assert j["state"] == "failed", j
    assert "quota" in j["error"] and f"jobs/{jid}" in j["error"], j["error"]
    assert str(srv.jobs_dir) not in j["error"] and str(srv.root) not in j["error"], j["error"]
