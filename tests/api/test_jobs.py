"""Jobs through the real server end to end: the seed example with curl (every step's
loss of every rank on the stream, metrics, logs, a checkpoint that loads in PyTorch),
uneven data with join on 2 and 3 ranks (and the same model as `ddpd run`), listing,
pagination and deletion."""
import json
import math
import subprocess

import numpy as np
import pytest

from pylib.server import final_state_events, seed_spec, st_decode

FINAL = ("succeeded", "failed", "cancelled")


def curl(*args, timeout=30):
    p = subprocess.run(["curl", "-sS", *args], capture_output=True, timeout=timeout)
    assert p.returncode == 0, f"curl {args}: exit {p.returncode}: {p.stderr!r}"
    return p.stdout


def check_envelope(evs, jid):
    """Every event carries job, attempt and seq; seqs run 1, 2, 3, ... without gaps or
    repeats; the stream ends with exactly one final state event."""
    assert evs, "no events"
    for e in evs:
        assert e.get("job") == jid and isinstance(e.get("attempt"), int) and isinstance(e.get("seq"), int), e
    seqs = [e["seq"] for e in evs]
    assert seqs == list(range(1, len(evs) + 1)), f"seqs not 1..N: first {seqs[:5]}, breaks at " + str(
        next((i for i, (a, b) in enumerate(zip(seqs, seqs[1:])) if b != a + 1), None))
    fin = final_state_events(evs)
    assert len(fin) == 1 and evs[-1] is fin[0], f"the stream must end with its one final state: {evs[-3:]}"


def losses_by_rank(evs):
    out = {}
    for e in evs:
        if e["event"] == "loss":
            steps = out.setdefault(e["rank"], {})
            assert e["step"] not in steps, f"step {e['step']} of rank {e['rank']} twice"
            steps[e["step"]] = e["loss"]
    return out


def load_torch(sd_np, fin, fout):
    torch = pytest.importorskip("torch")
    m = torch.nn.Sequential(torch.nn.Linear(fin, fout))
    m.load_state_dict({k: torch.from_numpy(v) for k, v in sd_np.items()})  # strict: same keys and shapes
    return torch, m


def test_seed_example_end_to_end_with_curl(server, curl_streams, work):
    spec = seed_spec(world_size=2, log_every=1)  # 3000 samples, batch 3: 500 steps per rank
    spec_file = work / "seed.json"
    spec_file.write_text(json.dumps(spec))
    hdr_file = work / "headers.txt"
    body = curl("-X", "POST", "-H", "Content-Type: application/json", "--data-binary", f"@{spec_file}",
                "-D", str(hdr_file), server.url + "/v1/jobs")
    head = hdr_file.read_text()
    assert head.split()[1] == "201", head
    job = json.loads(body)
    jid = job["id"]
    assert f"location: /v1/jobs/{jid}" in head.lower(), head
    assert job["state"] in ("queued", "starting", "running") and job["name"] == "seed-example"
    assert job["world_size"] == 2 and job["device"] == "cpu" and job["spec"]["log_every"] == 1

    st = curl_streams(f"{server.url}/v1/jobs/{jid}/events", fmt="ndjson",
                      headers=["Accept: application/x-ndjson"])
    evs = st.rest(timeout=90)
    assert st.proc.returncode == 0, st.stderr()
    check_envelope(evs, jid)
    states = [e["state"] for e in evs if e["event"] == "state"]
    assert states == ["queued", "starting", "running", "succeeded"], states
    starts = {e["rank"]: e for e in evs if e["event"] == "start"}
    assert sorted(starts) == [0, 1] and all(s["batches"] == 500 and s["world_size"] == 2 for s in starts.values())
    lb = losses_by_rank(evs)
    assert sorted(lb) == [0, 1]
    for r in (0, 1):
        assert sorted(lb[r]) == list(range(1, 501)), f"rank {r}: steps {min(lb[r])}..{max(lb[r])}, {len(lb[r])} of 500"
        assert all(v is not None and math.isfinite(v) for v in lb[r].values())
    # It trained: the last 50 steps' mean loss is well below the first 50's.
    first = np.mean([lb[r][s] for r in (0, 1) for s in range(1, 51)])
    last = np.mean([lb[r][s] for r in (0, 1) for s in range(451, 501)])
    assert last < 0.5 * first, (first, last)
    ck = [e for e in evs if e["event"] == "checkpoint"]
    assert ck and ck[-1]["step"] == 500, ck

    j = server.job(jid)
    assert j["state"] == "succeeded" and j["error"] is None and j["attempt"] == 1 and j["restarts"] == 0
    assert j["created_at"] <= j["started_at"] <= j["finished_at"], j
    assert [(r["rank"], r["state"], r["exit_code"], r["step"]) for r in j["ranks"]] == [
        (0, "succeeded", 0, 500), (1, "succeeded", 0, 500)], j["ranks"]

    # Metrics: the whole curve when max_points allows it ...
    m = server.get(f"/v1/jobs/{jid}/metrics", params={"max_points": 10000}).json()
    assert m["points"] == 1000 and m["first_step"] == 1 and m["last_step"] == 500, {k: m[k] for k in ("points", "first_step", "last_step")}
    assert m["mean"]["step"] == list(range(1, 501))
    want_mean = [(lb[0][s] + lb[1][s]) / 2 for s in range(1, 501)]
    np.testing.assert_allclose(m["mean"]["loss"], want_mean, rtol=1e-6)
    assert [r["rank"] for r in m["ranks"]] == [0, 1]
    for r in m["ranks"]:
        assert r["step"] == list(range(1, 501))
        np.testing.assert_allclose(r["loss"], [lb[r["rank"]][s] for s in range(1, 501)], rtol=1e-6)
    # ... and downsampled on the server, keeping the ends, the minimum and the maximum.
    m = server.get(f"/v1/jobs/{jid}/metrics", params={"max_points": 40}).json()
    for ser, full in [(m["mean"], dict(zip(range(1, 501), want_mean)))] + [
            (r, lb[r["rank"]]) for r in m["ranks"]]:
        assert 2 <= len(ser["step"]) <= 40 and len(ser["step"]) == len(ser["loss"]), len(ser["step"])
        assert ser["step"] == sorted(ser["step"]) and ser["step"][0] == 1 and ser["step"][-1] == 500
        np.testing.assert_allclose(ser["loss"], [full[s] for s in ser["step"]], rtol=1e-6)
        assert min(ser["loss"]) == pytest.approx(min(full.values()), rel=1e-6)
        assert max(ser["loss"]) == pytest.approx(max(full.values()), rel=1e-6)
    r = server.get(f"/v1/jobs/{jid}/metrics", params={"max_points": "x"})
    assert r.status_code == 400 and r.json()["error"]["path"] == "max_points", r.text

    # Logs of each rank are plain text.
    for rank in (0, 1):
        r = server.get(f"/v1/jobs/{jid}/logs", params={"rank": rank, "tail": 5})
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain"), r
    r = server.get(f"/v1/jobs/{jid}/logs", params={"rank": 2})
    assert r.status_code == 400 and r.json()["error"]["path"] == "rank", r.text

    # The checkpoint, downloaded with curl, is the job's model file and loads in PyTorch.
    blob = curl(server.url + f"/v1/jobs/{jid}/checkpoint")
    assert blob == (server.jobs_dir / str(jid) / "model.safetensors").read_bytes()
    sd, meta = st_decode(blob)
    assert sorted(sd) == ["0.bias", "0.weight"] and sd["0.weight"].shape == (5, 10) and sd["0.bias"].shape == (5,)
    assert sd["0.weight"].dtype == np.float32
    torch, model = load_torch(sd, 10, 5)
    x = torch.randn(7, 10)
    y = model(x)
    assert y.shape == (7, 5) and torch.isfinite(y).all()
    np.testing.assert_array_equal(model[0].weight.detach().numpy(), sd["0.weight"])

    prom = server.get("/metrics")
    assert prom.status_code == 200 and prom.headers["Content-Type"].startswith("text/plain")
    # ddpd_jobs counts the jobs now queued, starting or running: a finished one is history.
    assert 'ddpd_jobs{state="running"} 0' in prom.text and 'state="succeeded"' not in prom.text, prom.text[:2000]
    assert server.free_cpu_slots() == 2


def test_finished_job_keeps_its_progress(server):
    """GET /v1/jobs/{id} of a finished job still shows its last step and that step's
    mean loss (not null)."""
    jid = server.submit(seed_spec(world_size=2, log_every=1))["id"]
    evs = server.events(jid)
    lb = losses_by_rank(evs)
    j = server.wait_state(jid, FINAL, timeout=10)
    assert j["state"] == "succeeded"
    assert j["step"] == 500 and j["loss"] == pytest.approx((lb[0][500] + lb[1][500]) / 2, rel=1e-6), (
        f"finished job lost its progress: step={j['step']} loss={j['loss']}")


def ddpd_run(server, spec, out):
    """`ddpd run` of the same spec on the same data folder, for comparison."""
    f = out.parent / (out.name + ".json")
    f.write_text(json.dumps(spec))
    p = subprocess.run([str(server.bin / "ddpd"), "run", "--world-size", str(spec["world_size"]), "--device", "cpu",
                        "--out", str(out), "--data-dir", str(server.data_dir), str(f)],
                       capture_output=True, text=True, timeout=120, cwd=str(server.data_dir))
    assert p.returncode == 0, p.stderr[-2000:]
    return st_decode((out / "model.safetensors").read_bytes())[0]


def run_uneven(server, spec, batches, work):
    j = server.submit(spec)
    jid = j["id"]
    evs = server.events(jid, timeout=120)
    check_envelope(evs, jid)
    done = server.wait_state(jid, FINAL, timeout=10)
    assert done["state"] == "succeeded", f"{done['state']}: {done['error']}"
    W = spec["world_size"]
    starts = {e["rank"]: e["batches"] for e in evs if e["event"] == "start"}
    assert starts == dict(enumerate(batches)), starts
    lb = losses_by_rank(evs)
    longest = max(batches)
    for r in range(W):
        assert sorted(lb[r]) == list(range(1, batches[r] + 1)), f"rank {r}: {len(lb[r])} steps, want {batches[r]}"
    joins = {e["rank"]: e["step"] for e in evs if e["event"] == "join"}
    assert joins == {r: b for r, b in enumerate(batches) if b < longest}, joins
    assert [(r["rank"], r["exit_code"]) for r in done["ranks"]] == [(r, 0) for r in range(W)]
    m = server.get(f"/v1/jobs/{jid}/metrics", params={"max_points": 10000}).json()
    assert m["last_step"] == longest and m["mean"]["step"] == list(range(1, longest + 1))
    # The mean at a step only some ranks reached is over those ranks.
    s = longest
    live = [lb[r][s] for r in range(W) if s in lb[r]]
    assert m["mean"]["loss"][-1] == pytest.approx(sum(live) / len(live), rel=1e-6)
    sd = st_decode(server.get(f"/v1/jobs/{jid}/checkpoint").content)[0]
    ref = ddpd_run(server, spec, work / f"run-{jid}")
    assert sorted(sd) == sorted(ref)
    for k in ref:
        np.testing.assert_allclose(sd[k], ref[k], rtol=1e-6, atol=1e-7, err_msg=f"server vs ddpd run: {k}")
    assert server.free_cpu_slots() == server.cpu_slots


def test_two_ranks_uneven_synthetic_join(server, work):
    # 3001 samples over 2 ranks: shards of 1501 and 1500, batch 3: 501 and 500 batches.
    spec = seed_spec(name="join-2", world_size=2, log_every=1, data={"type": "synthetic", "samples": 3001, "seed": 1})
    run_uneven(server, spec, [501, 500], work)


def test_three_ranks_uneven_npy_join(make_server, work):
    srv = make_server(cpu_slots=3)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((101, 10)).astype(np.float32)
    y = (x @ rng.standard_normal((10, 5)).astype(np.float32)).astype(np.float32)
    np.save(srv.data_dir / "x.npy", x)
    np.save(srv.data_dir / "y.npy", y)
    # 101 samples over 3 ranks: 34, 34, 33; batch 2: 17, 17, 17 -> use batch 1 (34, 34, 33).
    spec = seed_spec(name="join-3", world_size=3, log_every=1, batch_size=1,
                     data={"type": "npy", "x": "x.npy", "y": "y.npy", "shuffle": False},
                     ddp={"join": True})
    run_uneven(srv, spec, [34, 34, 33], work)


def test_uneven_with_join_false_is_rejected(server):
    spec = seed_spec(world_size=2, data={"type": "synthetic", "samples": 3001, "seed": 1}, ddp={"join": False})
    r = server.post("/v1/jobs", json=spec)
    assert r.status_code == 422 and r.json()["error"]["path"] == "ddp.join", r.text
    assert server.get("/v1/jobs").json()["jobs"] == []


def test_list_paginate_filter_delete(server):
    ids = []
    for i in range(5):
        ids.append(server.submit(seed_spec(name=f"j{i}", steps=20, epochs=None))["id"])
    for jid in ids:
        server.wait_state(jid, FINAL, timeout=60)
    r = server.get("/v1/jobs", params={"limit": 2})
    assert r.status_code == 200
    page = r.json()
    assert [j["id"] for j in page["jobs"]] == ids[::-1][:2] and page["next"], page
    seen = [j["id"] for j in page["jobs"]]
    for _ in range(5):
        if not page["next"]:
            break
        page = server.get("/v1/jobs", params={"limit": 2, "before": page["next"]}).json()
        seen += [j["id"] for j in page["jobs"]]
    assert seen == ids[::-1] and page["next"] is None, (seen, page["next"])
    assert [j["id"] for j in server.get("/v1/jobs", params={"state": "succeeded"}).json()["jobs"]] == ids[::-1]
    assert server.get("/v1/jobs", params={"state": "queued,running"}).json()["jobs"] == []
    r = server.get("/v1/jobs", params={"state": "bogus"})
    assert r.status_code == 400 and r.json()["error"]["path"] == "state", r.text
    r = server.get("/v1/jobs", params={"limit": 0})
    assert r.status_code == 400 and r.json()["error"]["path"] == "limit", r.text

    victim = ids[0]
    d = server.jobs_dir / str(victim)
    assert (d / "model.safetensors").exists()
    r = server.delete(f"/v1/jobs/{victim}")
    assert r.status_code == 204, r.text
    assert not d.exists(), "DELETE left the job's files"
    assert server.get(f"/v1/jobs/{victim}").status_code == 404
    assert server.get(f"/v1/jobs/{victim}/events", params={"format": "ndjson"}).status_code == 404
    assert server.delete(f"/v1/jobs/{victim}").status_code == 404
    assert victim not in [j["id"] for j in server.get("/v1/jobs").json()["jobs"]]
    r = server.post(f"/v1/jobs/{ids[1]}/cancel")
    assert r.status_code == 409 and "finished" in r.json()["error"]["message"], r.text
    assert server.post("/v1/jobs/999999/cancel").status_code == 404


def test_gpt_preset_job_shows_the_preset_and_its_layers(server):
    """issue 30: a job whose model is the gpt preset runs, and GET /v1/jobs/{id} shows the
    preset as given (every default written out) with the layers it expanded to; its model
    file names the tied weight twice. A bad field is a 422 naming it, and no job."""
    rng = np.random.default_rng(0)
    rng.integers(0, 24, 8 * 12 + 1).astype(np.uint16).tofile(server.data_dir / "preset.bin")
    model = {"preset": "gpt", "layers": 2, "dim": 8, "heads": 2, "vocab": 24, "block_size": 8}
    spec = {"name": "preset", "model": model, "loss": "cross_entropy", "optimizer": {"type": "adamw", "lr": 0.01},
            "data": {"type": "tokens", "path": "preset.bin", "block_size": 8}, "batch_size": 4, "steps": 2}
    j = server.submit(spec)
    assert server.wait_state(j["id"], ("succeeded",), timeout=60), server.job(j["id"])
    shown = server.job(j["id"])["spec"]
    m = shown["model"]
    assert {k: m[k] for k in model} == model and m["dropout"] == 0 and m["bias"] is True and m["tie"] is True, m
    assert [l["type"] for l in m["expanded"]] == ["embedding", "position", "dropout"] + ["residual"] * 4 + [
        "layernorm", "linear"], m["expanded"]
    assert m["expanded"][-1]["tie"] == "0" and m["expanded"][-1]["bias"] is False, m["expanded"][-1]
    assert shown["input_shape"] == [8], shown
    r = server.get(f"/v1/jobs/{j['id']}/checkpoint")
    assert r.status_code == 200, r.text[:300]
    w = st_decode(r.content)[0]
    assert np.array_equal(w["0.weight"], w["8.weight"]), sorted(w)

    bad = dict(spec, model=dict(model, heads=3))
    r = server.post("/v1/jobs", json=bad)
    assert r.status_code == 422, r.text
    e = r.json()["error"]
    assert e["path"] == "model.heads" and e["message"] == "dim 8 is not a multiple of heads 3", e
