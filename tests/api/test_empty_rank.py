"""A rank with nothing to do, through the server (issue 15 item 18): a job whose rank 1
has an empty `{rank}` file, and one with fewer synthetic samples than ranks, are accepted
(201) and succeed, the empty ranks joining at once; with `ddp.join: false` the synthetic
one is refused at submit (422 at `ddp.join`, the message naming the rank and join)."""
import numpy as np

from pylib.server import seed_spec

FINAL = ("succeeded", "failed", "cancelled")


def test_empty_rank_file_job_succeeds(make_server):
    srv = make_server(cpu_slots=3)
    rng = np.random.default_rng(3)
    np.save(srv.data_dir / "x_0.npy", rng.standard_normal((6, 10)).astype(np.float32))
    np.save(srv.data_dir / "y_0.npy", rng.standard_normal((6, 5)).astype(np.float32))
    np.save(srv.data_dir / "x_1.npy", np.zeros((0, 10), np.float32))
    np.save(srv.data_dir / "y_1.npy", np.zeros((0, 5), np.float32))
    spec = seed_spec(world_size=2, epochs=2, batch_size=2, log_every=1,
                     data={"type": "npy", "x": "x_{rank}.npy", "y": "y_{rank}.npy"})
    jid = srv.submit(spec)["id"]
    j = srv.wait_state(jid, FINAL, timeout=120)
    assert j["state"] == "succeeded", j
    ev = srv.events(jid)
    assert [e["step"] for e in ev if e.get("event") == "join" and e["rank"] == 1] == [0, 3], ev
    assert not [e for e in ev if e.get("event") == "loss" and e["rank"] == 1]


def test_fewer_synthetic_samples_than_ranks(make_server):
    srv = make_server(cpu_slots=3)
    spec = seed_spec(world_size=3, epochs=2, batch_size=1, data={"type": "synthetic", "samples": 2, "seed": 1})
    jid = srv.submit(spec)["id"]
    assert srv.wait_state(jid, FINAL, timeout=120)["state"] == "succeeded"
    r = srv.post("/v1/jobs", json=dict(spec, ddp={"join": False}))
    assert r.status_code == 422, r.text
    e = r.json()["error"]
    assert e["path"] == "ddp.join" and "rank 2 has no batch" in e["message"] and "auto" in e["message"], e
