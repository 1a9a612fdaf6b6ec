"""The small things of issue 19 part 4, each through the real server: error messages that
say what happened and where, query parameters that are checked, the server's options,
and /metrics."""
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
