"""Eval events, lr and grad_norm through the real server (CONTRACT.md §2a): a 2-rank job
with a cosine schedule, grad_clip and eval every 4 steps; its eval events are on the
event stream (rank 0, in seq order, after their step's loss event), they are stored (the
stream of the finished job is read back from the store), and GET /v1/jobs/{id}/metrics
returns the eval series and the lr series equal to what the events say."""
import pytest

from pylib.server import seed_spec


def test_eval_events_stored_streamed_and_in_metrics(server):
    spec = seed_spec(
        world_size=2, steps=10, epochs=None, log_every=1, batch_size=8, grad_clip=0.5,
        model=[{"type": "linear", "in": 10, "out": 16}, {"type": "relu"}, {"type": "linear", "in": 16, "out": 3}],
        loss="cross_entropy",
        optimizer={"type": "sgd", "lr": 0.1, "schedule": {"type": "cosine", "warmup_steps": 3, "min_lr": 0.001}},
        data={"type": "synthetic", "samples": 400, "seed": 1},
        eval={"data": {"type": "synthetic", "samples": 50, "seed": 2}, "every_steps": 4})
    jid = server.submit(spec)["id"]
    assert server.wait_state(jid, ("succeeded", "failed", "cancelled"))["state"] == "succeeded", server.job(jid)

    evs = server.events(jid)
    evals = [e for e in evs if e["event"] == "eval"]
    assert [e["step"] for e in evals] == [4, 8, 10], evals
    for e in evals:
        assert e["rank"] == 0 and e["job"] == jid and isinstance(e["seq"], int)
        assert e["samples"] == 50 and 0 <= e["accuracy"] <= 1 and e["loss"] > 0, e
        # after rank 0's loss event of its step (the ranks' streams interleave)
        loss_seqs = [x["seq"] for x in evs if x["event"] == "loss" and x["step"] == e["step"] and x["rank"] == 0]
        assert loss_seqs and max(loss_seqs) < e["seq"], (e, loss_seqs)
    losses = {(e["rank"], e["step"]): e for e in evs if e["event"] == "loss"}
    assert sorted(losses) == [(r, s) for r in (0, 1) for s in range(1, 11)]
    for (r, s), e in losses.items():
        assert e["grad_norm"] > 0, e
        want = 0.1 * s / 3 if s <= 3 else None
        if want is not None:
            assert e["lr"] == pytest.approx(want, rel=1e-12), e
    assert losses[(0, 10)]["lr"] == pytest.approx(0.001, rel=1e-12)

    m = server.get(f"/v1/jobs/{jid}/metrics").json()
    assert m["eval"] == {"step": [4, 8, 10], "loss": [e["loss"] for e in evals],
                         "accuracy": [e["accuracy"] for e in evals], "samples": [50, 50, 50]}, m["eval"]
    assert m["lr"]["step"] == list(range(1, 11))
    assert m["lr"]["lr"] == pytest.approx([losses[(0, s)]["lr"] for s in range(1, 11)], rel=1e-15)


def test_metrics_without_eval_or_lr(server):
    """A job without eval has an empty eval series; lr is there (every loss event has it)."""
    jid = server.submit(seed_spec(steps=5, epochs=None, log_every=1))["id"]
    assert server.wait_state(jid, ("succeeded", "failed", "cancelled"))["state"] == "succeeded"
    m = server.get(f"/v1/jobs/{jid}/metrics").json()
    assert "eval" in m, m
    assert m["eval"] == {"step": [], "loss": [], "accuracy": [], "samples": []}
    assert m["lr"] == {"step": [1, 2, 3, 4, 5], "lr": [0.01] * 5}


def test_eval_data_checked_at_submission(server):
    """A missing or misshapen eval file is a 422 at submission that names eval.data and the
    file, as for the training data (the planner checks it before the job is accepted)."""
    import numpy as np
    np.save(server.data_dir / "x.npy", np.zeros((8, 10), np.float32))
    np.save(server.data_dir / "y.npy", np.zeros((8, 5), np.float32))
    np.save(server.data_dir / "ex.npy", np.zeros((8, 9), np.float32))
    base = dict(data={"type": "npy", "x": "x.npy", "y": "y.npy"})
    for x, want in (("nope.npy", "nope.npy"), ("ex.npy", "ex.npy")):
        r = server.post("/v1/jobs", json=seed_spec(
            **base, eval={"data": {"type": "npy", "x": x, "y": "y.npy"}, "every_steps": 2}))
        assert r.status_code == 422, r.text
        e = r.json()["error"]
        assert e["path"].startswith("eval.data"), e
        assert e["message"].startswith("eval.data: ") and want in e["message"], e


def err_of(r, status):
    assert r.status_code == status, f"expected {status}, got {r.status_code}: {r.text[:500]}"
    return r.json()["error"]


@pytest.mark.parametrize("kind", ["npy", "synthetic"])
def test_eval_data_over_the_memory_limit_is_refused_at_submission(make_server, kind):
    """A job that fits in --max-rank-memory but for its eval set is a 422 at submission
    naming eval.data (npy files: the planner reads the eval rows; synthetic: the server
    counts them from the spec), with the eval data's share in the message; the same job
    with a small eval set is accepted and runs."""
    import numpy as np
    srv = make_server(cpu_slots=1, extra=["--max-rank-memory", "16M"])
    np.save(srv.data_dir / "x.npy", np.zeros((40, 10), np.float32))
    np.save(srv.data_dir / "y.npy", np.zeros((40, 5), np.float32))
    small = {"type": "npy", "x": "x.npy", "y": "y.npy"}
    if kind == "npy":  # 400000 rows: 16 MB + 8 MB loaded (each under 64 MiB), 3.2 MB of order
        np.save(srv.data_dir / "ex.npy", np.zeros((400000, 10), np.float32))
        np.save(srv.data_dir / "ey.npy", np.zeros((400000, 5), np.float32))
        big, path = {"type": "npy", "x": "ex.npy", "y": "ey.npy"}, "eval.data"
    else:  # 400000 synthetic rows, generated whole by the rank
        big, path = {"type": "synthetic", "samples": 400000, "seed": 2}, "eval.data.samples"
    data = small if kind == "npy" else {"type": "synthetic", "samples": 40, "seed": 1}
    e = err_of(srv.post("/v1/jobs", json=seed_spec(data=data, eval={"data": big, "every_steps": 5})), 422)
    assert e["path"] == path, e
    m = e["message"]
    assert "the job needs about" in m and ", eval data 2" in m and "limit of 16.0 MiB per rank" in m, m
    assert "--max-rank-memory" in m, m
    assert srv.get("/v1/jobs").json()["jobs"] == []
    ok = small if kind == "npy" else {"type": "synthetic", "samples": 30, "seed": 2}
    j = srv.submit(seed_spec(data=data, eval={"data": ok, "every_steps": 5}))
    assert srv.wait_state(j["id"], ("succeeded", "failed", "cancelled"), timeout=60)["state"] == "succeeded"
