"""What the planner finds in the data before a job is accepted, and what it leaves to the
ranks (issue 28, items 6, 7 and 9), against the real server:
- a training batch that gives a batchnorm layer one value per channel (PyTorch's "Expected
  more than 1 value per channel when training") is a 422 naming the layer's JSON path, the
  rank, the batch and its size, and data.drop_last; batches the job never trains (a step
  budget that ends first) and eval batches (running statistics) are fine;
- CSV cells that are NaN, infinite or past float32's range, and repeated header names, are
  a 422 naming the file, the line and the column(s);
- `tokens` files per rank (`{rank}`): each rank reads its own file whole (windows of
  different counts, an empty one, eval data too), and an id out of range in one is that
  rank's data error before its first step."""
import numpy as np
import pytest

from pylib.server import seed_spec

FINAL = ("succeeded", "failed", "cancelled")
TORCH_WORDS = "Expected more than 1 value per channel when training"


def err_422(server, spec):
    r = server.post("/v1/jobs", json=spec)
    assert r.status_code == 422, f"expected 422, got {r.status_code}: {r.text[:800]}"
    return r.json()["error"]


def no_jobs(server):
    return server.get("/v1/jobs").json()["jobs"] == []


def run_ok(server, spec, timeout=120):
    jid = server.submit(spec)["id"]
    j = server.wait_state(jid, FINAL, timeout=timeout)
    assert j["state"] == "succeeded", j
    return server.events(jid)


# ---- item 6: batchnorm and batches of one ------------------------------------------------

# The batchnorm inside a residual, so its path is model[1].layers[0].
BN_MODEL = [{"type": "linear", "in": 10, "out": 4},
            {"type": "residual", "layers": [{"type": "batchnorm", "features": 4}]},
            {"type": "linear", "in": 4, "out": 5}]


def bn_spec(server, rows=9, **over):
    rng = np.random.default_rng(1)
    np.save(server.data_dir / "x.npy", rng.standard_normal((rows, 10)).astype(np.float32))
    np.save(server.data_dir / "y.npy", rng.standard_normal((rows, 5)).astype(np.float32))
    return seed_spec(**dict(dict(model=BN_MODEL, input_shape=[10], world_size=2, batch_size=2, log_every=1,
                                 data={"type": "npy", "x": "x.npy", "y": "y.npy"}), **over))


def test_batchnorm_batch_of_one_is_422_naming_the_layer_and_the_batch(make_server):
    """9 samples over 2 ranks: shards of 5 and 4, batches of 2: rank 0's third batch of
    every epoch holds one sample (rank 1 has two batches: join). The old code accepted the
    job, which then failed at rank 0's third step."""
    server = make_server(cpu_slots=2)
    e = err_422(server, bn_spec(server))
    assert e["path"] == "model[1].layers[0]", e
    for w in ("model[1].layers[0] (batchnorm): rank 0's last batch of every epoch (batch 3 of 3, in step 3 "
              "of the epoch) holds 1 of its 5 samples", "input size is [1, 4]", TORCH_WORDS,
              "set data.drop_last to true"):
        assert w in e["message"], (w, e)
    e = err_422(server, bn_spec(server, batch_size=1))
    assert e["path"] == "model[1].layers[0]" and "batches of batch_size 1 give it input size [1, 4]" in \
        e["message"] and "set batch_size to 2 or more" in e["message"], e
    assert no_jobs(server)

    # What the advice says runs: drop_last leaves the batch of one out.
    spec = bn_spec(server)
    spec["data"]["drop_last"] = True
    ev = run_ok(server, spec)
    assert max(e["step"] for e in ev if e.get("event") == "loss") == 2
    # A step budget that ends before the batch never trains it.
    ev = run_ok(server, bn_spec(server, epochs=None, steps=2))
    assert max(e["step"] for e in ev if e.get("event") == "loss") == 2
    # Eval batches use the running statistics: an eval shard of one sample is fine.
    np.save(server.data_dir / "vx.npy", np.ones((3, 10), np.float32))
    np.save(server.data_dir / "vy.npy", np.ones((3, 5), np.float32))
    spec = bn_spec(server, rows=8, eval={"data": {"type": "npy", "x": "vx.npy", "y": "vy.npy", "shuffle": False},
                                         "every_steps": 1})
    ev = run_ok(server, spec)
    assert [e["samples"] for e in ev if e.get("event") == "eval"] == [3, 3], ev


# ---- item 7: CSV cells and header --------------------------------------------------------

def csv_spec(server, text, name="d.csv"):
    (server.data_dir / name).write_text(text)
    return seed_spec(model=[{"type": "linear", "in": 3, "out": 1}], batch_size=2,
                     data={"type": "csv", "path": name, "target": "y"})


GOOD_ROWS = "".join(f"{i},{i + 1},{i + 2},{i % 3}\n" for i in range(20))


@pytest.mark.parametrize("cell", ["nan", "NaN", "-nan", "inf", "-Inf", "+INFINITY", "infinity", " nan(7) ",
                                  '"inf"', "1e39", "-3.5e38"])
def test_csv_cell_that_is_not_finite_is_422_naming_line_and_column(server, cell):
    """The old code accepted these (strtod reads them), and the job then failed at its
    first step with a NaN loss. The cell is the last one of line 19: the check reads every
    cell of the file."""
    rows = GOOD_ROWS.splitlines()
    rows[17] = f"1,2,3,{cell}"
    e = err_422(server, csv_spec(server, "a,b,c,y\n" + "\n".join(rows) + "\n"))
    assert e["path"] == "data", e
    shown = cell[1:-1] if cell.startswith('"') else cell  # the cell's text, quotes off
    assert e["message"].startswith(f'd.csv: line 19, column 4 ("y"): "{shown}" is '), e
    assert "not a finite number" in e["message"] or "beyond float32's range" in e["message"], e
    assert no_jobs(server)


def test_csv_repeated_header_name_is_422_naming_both_columns(server):
    e = err_422(server, csv_spec(server, "a,b,a,y\n" + GOOD_ROWS))
    assert e["path"] == "data", e
    assert e["message"] == ('d.csv: line 1 (the header): columns 1 and 3 are both named "a"; the header\'s '
                            "names must be distinct"), e
    # The target's name repeated is the same error (it was "2 columns are named").
    e = err_422(server, csv_spec(server, "y,b,c,y\n" + GOOD_ROWS))
    assert "columns 1 and 4 are both named \"y\"" in e["message"], e
    # So is a repeat in eval.data, named as the eval data.
    spec = csv_spec(server, "a,b,c,y\n" + GOOD_ROWS)
    (server.data_dir / "v.csv").write_text("a,b,b,y\n1,2,3,4\n")
    spec["eval"] = {"data": {"type": "csv", "path": "v.csv", "target": "y", "shuffle": False}, "every_steps": 5}
    e = err_422(server, spec)
    assert e["message"].startswith('eval.data: v.csv: line 1 (the header): columns 2 and 3 are both named "b"'), e
    assert no_jobs(server)
    server.submit(csv_spec(server, "a,b,c,y\n" + GOOD_ROWS))


# ---- item 9: tokens files per rank -------------------------------------------------------

T = 8


def gpt_spec(data, world, **over):
    return seed_spec(model=[{"type": "embedding", "num": 64, "dim": 8},
                            {"type": "position", "max": T, "dim": 8},
                            {"type": "linear", "in": 8, "out": 64}],
                     input_shape=[T], loss="cross_entropy", data=data, batch_size=2, world_size=world,
                     log_every=1, **over)


def test_tokens_file_per_rank_runs_each_ranks_own_file(make_server):
    """Rank 0's file holds 12 windows (and 3 ids no window reaches), rank 1's 8, rank 2's
    none: 6, 4 and 0 batches, ranks 1 and 2 join. Eval reads per-rank files too. The old
    code refused {rank} for tokens (422 at data.path)."""
    server = make_server(cpu_slots=3)
    rng = np.random.default_rng(5)
    rng.integers(0, 64, 12 * T + 1 + 3).astype(np.uint16).tofile(server.data_dir / "tok_0.bin")
    rng.integers(0, 64, 8 * T + 1).astype(np.uint16).tofile(server.data_dir / "tok_1.bin")
    (server.data_dir / "tok_2.bin").write_bytes(b"")
    for r, n in enumerate([3, 2, 0]):
        rng.integers(0, 64, n * T + 1 if n else 4).astype(np.uint16).tofile(server.data_dir / f"val_{r}.bin")
    data = {"type": "tokens", "path": "tok_{rank}.bin", "block_size": T}
    spec = gpt_spec(data, 3, epochs=2,
                    eval={"data": {"type": "tokens", "path": "val_{rank}.bin", "block_size": T, "shuffle": False},
                          "every_steps": 6})
    ev = run_ok(server, spec)
    starts = {e["rank"]: e["batches"] for e in ev if e.get("event") == "start"}
    assert starts == {0: 6, 1: 4, 2: 0}, starts
    assert [e["step"] for e in ev if e.get("event") == "join" and e["rank"] == 2] == [0, 6], ev
    assert [e["step"] for e in ev if e.get("event") == "join" and e["rank"] == 1] == [4, 10], ev
    assert not [e for e in ev if e.get("event") == "loss" and e["rank"] == 2]
    assert [(e["step"], e["samples"]) for e in ev if e.get("event") == "eval"] == [(6, 5), (12, 5)], ev


def test_tokens_file_per_rank_with_a_bad_id_fails_that_rank_before_training(make_server):
    """Only the rank sees its own file: it checks the ids on opening it (as the planner
    does for a shared file), so the job fails naming the file, the sample and the
    position, before any step."""
    server = make_server(cpu_slots=2)
    ids = np.arange(6 * T + 1, dtype=np.uint16) % 64
    ids.tofile(server.data_dir / "t_0.bin")
    ids[3 * T + 5] = 300
    ids.tofile(server.data_dir / "t_1.bin")
    jid = server.submit(gpt_spec({"type": "tokens", "path": "t_{rank}.bin", "block_size": T}, 2))["id"]
    j = server.wait_state(jid, FINAL, timeout=120)
    assert j["state"] == "failed", j
    ev = server.events(jid)
    # Rank 1's own error event (which rank's exit the job's error names is issue 28 item 8's).
    assert any(e.get("event") == "error" and e["rank"] == 1 and e.get("kind") == "data" and
               "t_1.bin: id 300 at sample 3, position 5 is out of range [0, 64)" in e["message"] for e in ev), ev
    assert not [e for e in ev if e.get("event") == "loss"]
