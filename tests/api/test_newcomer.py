"""test_newcomer.py — the small things a newcomer met (issue 31), each through the real
server: numbers without float noise in every JSON answer, the metrics as CSV, a data
path's error naming the data directory."""
import json
import re

from pylib.server import seed_spec

FINAL = ("succeeded", "failed", "cancelled")

# A real with 16 or more significant digits: what %.17g makes of 0.003 or 451.4.
NOISE = re.compile(r"\d\.?\d*(?:0000000000|9999999999)\d")


def test_json_answers_print_reals_as_written_without_float_noise(server):
    spec = seed_spec(name="noise", optimizer={"type": "sgd", "lr": 0.003, "momentum": 0.9})
    r = server.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    assert '"lr":0.003,' in r.text and '"momentum":0.9' in r.text, r.text
    jid = r.json()["id"]
    server.wait_state(jid, FINAL)
    for path in (f"/v1/jobs/{jid}", "/v1/jobs", f"/v1/jobs/{jid}/metrics", f"/v1/jobs/{jid}/checkpoints"):
        t = server.get(path).text
        assert not NOISE.search(t), (path, NOISE.search(t).group(0), t[:400])
    j = server.get(f"/v1/jobs/{jid}").text
    assert '"lr":0.003,' in j, j
    # Every rank's samples/s is the event's own text (one decimal), not %.17g of it.
    for rk in json.loads(j)["ranks"]:
        v = rk["samples_per_s"]
        assert re.search(r'"samples_per_s":%s[,}]' % re.escape(repr(v)), j), (v, j)
    # The event stream's bodies are the event encoder's, which was already shortest.
    ev = server.get(f"/v1/jobs/{jid}/events", params={"format": "ndjson"}).text
    assert not NOISE.search(ev), NOISE.search(ev).group(0)


def test_metrics_as_csv_one_row_per_step_with_every_curve(server):
    """GET /v1/jobs/{id}/metrics?format=csv: text/csv, a header starting with `step`, and
    each row the values the JSON metrics give at that step (empty where none)."""
    import csv
    import io
    spec = seed_spec(name="csv", world_size=2, epochs=None, steps=30, log_every=1, grad_clip=1.0,
                     optimizer={"type": "sgd", "lr": 0.05, "schedule": {"type": "cosine", "warmup_steps": 3}},
                     eval={"data": {"type": "synthetic", "samples": 50, "seed": 2}, "every_steps": 7})
    jid = server.submit(spec)["id"]
    assert server.wait_state(jid, FINAL)["state"] == "succeeded"
    r = server.get(f"/v1/jobs/{jid}/metrics", params={"format": "csv"})
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "text/csv", r.headers
    rows = list(csv.reader(io.StringIO(r.text)))
    assert rows[0] == ["step", "loss", "loss_rank_0", "loss_rank_1", "lr", "grad_norm", "time", "eval_loss",
                       "eval_accuracy", "eval_samples"], rows[0]
    m = server.get(f"/v1/jobs/{jid}/metrics", params={"max_points": 100000}).json()
    want = {}
    for col, s in [("loss", m["mean"])] + [(f"loss_rank_{x['rank']}", x) for x in m["ranks"]]:
        for st, v in zip(s["step"], s["loss"]):
            want.setdefault(st, {})[col] = v
    for col in ("lr", "grad_norm", "time"):
        assert len(m[col]["step"]) == 30, (col, m[col])
        for st, v in zip(m[col]["step"], m[col][col]):
            want.setdefault(st, {})[col] = v
    for k, st in enumerate(m["eval"]["step"]):
        w = want.setdefault(st, {})
        w["eval_loss"], w["eval_accuracy"], w["eval_samples"] = (m["eval"]["loss"][k], m["eval"]["accuracy"][k],
                                                                 m["eval"]["samples"][k])
    steps = [int(row[0]) for row in rows[1:]]
    assert steps == sorted(want) and steps == list(range(1, 31)), steps
    for row in rows[1:]:
        got = dict(zip(rows[0][1:], row[1:]))
        exp = want[int(row[0])]
        for col in rows[0][1:]:
            v = exp.get(col)
            # The same double, in its shortest form (Python's repr is the shortest too).
            ok = got[col] == "" if v is None else (float(got[col]) == v and len(got[col]) <= len(repr(float(v))))
            assert ok, (row, col, v)
    at = rows[0].index("eval_loss")
    assert len([row for row in rows[1:] if row[at]]) == len(m["eval"]["step"]) >= 4, rows
    # max_points thins the CSV as it thins the JSON; a format that is not one is a 400.
    r = server.get(f"/v1/jobs/{jid}/metrics", params={"format": "csv", "max_points": 4})
    # At most 4 points of each of its 7 series (mean, 2 ranks, lr, grad_norm, time, eval), fewer rows
    # than the 30 steps.
    assert len(r.text.splitlines()) - 1 <= min(4 * 7, 29), r.text
    r = server.get(f"/v1/jobs/{jid}/metrics", params={"format": "xml"})
    assert r.status_code == 400 and r.json()["error"]["path"] == "format", r.text
    assert server.get("/v1/jobs/99999/metrics", params={"format": "csv"}).status_code == 404


def test_a_missing_data_file_names_the_data_directory(server, work):
    """A data path is resolved against the server's --data-dir; a file that is not there
    says where it was looked for (the newcomer's file was in the examples' folder)."""
    import os
    e = server.post("/v1/jobs", json=seed_spec(data={"type": "npy", "x": "mnist/x.npy", "y": "mnist/y.npy"}))
    assert e.status_code == 422, e.text
    e = e.json()["error"]
    assert e["path"] == "data" and e["message"] == (
        "mnist/x.npy: cannot open: No such file or directory (data paths are resolved against the data "
        f"directory {os.path.realpath(server.data_dir)})"), e


def test_after_a_cancel_the_job_and_the_ranks_log_name_the_same_step(server):
    """The rank's log said it was cancelled at step 1774 while the job showed 1770 (its
    last logged step with log_every 10). Now a cancel between two steps logs the step the
    rank ends after, and the log names that step: the two agree."""
    import re
    from pylib.server import FOREVER_STEPS, wait_until
    for world in (1, 2):
        jid = server.submit(seed_spec(name="cancel-steps", world_size=world, epochs=None, steps=FOREVER_STEPS,
                                      log_every=97))["id"]
        server.wait_running(jid)
        wait_until(lambda: (server.job(jid)["step"] or 0) >= 97, 60, "a logged step")
        assert server.post(f"/v1/jobs/{jid}/cancel").status_code == 202
        j = server.wait_state(jid, FINAL)
        assert j["state"] == "cancelled", j
        said = 0
        for rank in range(world):
            log = server.get(f"/v1/jobs/{jid}/logs", params={"rank": rank}).text
            # A rank that saw the SIGTERM names its step; a peer may end first on the
            # cancelled rank's abort ("after another rank's failure"), naming none.
            m = re.search(r"cancelled by SIGTERM after step (\d+)", log)
            if m:
                said += 1
                assert j["ranks"][rank]["step"] == int(m.group(1)), (rank, m.group(0), j["ranks"][rank])
        assert said >= 1, j
        if world == 1:
            assert j["step"] == j["ranks"][0]["step"], j


def test_the_example_data_scripts_write_into_the_servers_data_directory(server, work):
    """examples/gpt_char_data.py writes into $DDPD_DATA_DIR/gpt-char/ (not the folder it runs
    in, not the source tree), where examples/gpt-char.json names its files: the server's
    data directory serves the example as it is."""
    import os
    import subprocess
    import sys
    from pylib.common import REPO
    env = dict(os.environ, DDPD_DATA_DIR=str(server.data_dir))
    cwd = work / "cwd"
    cwd.mkdir()
    r = subprocess.run([sys.executable, str(REPO / "examples" / "gpt_char_data.py")], cwd=str(cwd), env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (server.data_dir / "gpt-char" / "train.bin").stat().st_size > 0
    assert (server.data_dir / "gpt-char" / "eval.bin").stat().st_size > 0
    assert not list(cwd.glob("**/*.bin")) and not list((REPO / "examples").glob("**/*.bin"))
    spec = json.loads((REPO / "examples" / "gpt-char.json").read_text())
    spec.update(steps=2, log_every=1)
    spec["eval"]["every_steps"] = 1
    jid = server.submit(spec)["id"]  # 201: the planner read both files from the data directory
    assert server.wait_state(jid, FINAL, timeout=120)["state"] == "succeeded"
    # --data-dir wins over the environment.
    other = work / "elsewhere"
    r = subprocess.run([sys.executable, str(REPO / "examples" / "gpt_char_data.py"), "--data-dir", str(other)],
                       cwd=str(cwd), env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and (other / "gpt-char" / "train.bin").exists(), r.stderr


def test_ddpd_run_takes_the_file_ddpd_submit_takes_tags_and_notes_included(work):
    """A spec file with tags and notes (job metadata) runs with `ddpd run` as it is; a bad
    tag is still refused, naming it."""
    import subprocess
    from pylib.common import bin_dir
    spec = seed_spec(name="meta", epochs=None, steps=3, tags=["a", "b"], notes="local run")
    p = work / "spec.json"
    p.write_text(json.dumps(spec))
    (work / "data").mkdir()
    r = subprocess.run([str(bin_dir() / "ddpd"), "run", "--out", str(work / "out"), "--data-dir", str(work / "data"),
                        str(p)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    p.write_text(json.dumps(dict(spec, tags=["ok", "a\u0007"])))
    r = subprocess.run([str(bin_dir() / "ddpd"), "run", "--out", str(work / "out2"), "--data-dir",
                        str(work / "data"), str(p)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "tags[1]" in r.stderr and "U+0007" in r.stderr, r.stderr
