"""A job's final and best metrics (docs/api.md "Job metrics") in GET /v1/jobs/{id} and in
the list, computed here from the job's own eval events; the grad_norm and time series of
GET /v1/jobs/{id}/metrics against the loss events; and the migration that fills the
metrics of jobs stored before it from their events."""
import sqlite3

import pytest

from pylib.common import REPO
from pylib.server import seed_spec

FIELDS = ("step", "loss", "eval_step", "eval_loss", "eval_accuracy", "best_eval_loss",
          "best_eval_loss_step", "best_eval_accuracy", "best_eval_accuracy_step")


def classifier_spec(**over):
    """A 2-rank classifier whose eval every 2 steps moves both ways (lr high enough)."""
    s = seed_spec(
        world_size=2, steps=12, epochs=None, log_every=1, batch_size=8, grad_clip=0.5,
        model=[{"type": "linear", "in": 10, "out": 16}, {"type": "relu"}, {"type": "linear", "in": 16, "out": 3}],
        loss="cross_entropy", optimizer={"type": "sgd", "lr": 0.5},
        data={"type": "synthetic", "samples": 400, "seed": 1},
        eval={"data": {"type": "synthetic", "samples": 50, "seed": 2}, "every_steps": 2})
    s.update(over)
    return s


def expected_metrics(job, evs):
    """The metrics a job's events imply: final = highest step's eval, best = the lowest
    loss / highest accuracy, first occurrence."""
    evals = sorted((e for e in evs if e["event"] == "eval"), key=lambda e: e["step"])
    want = {k: None for k in FIELDS}
    want["step"], want["loss"] = job["step"], job["loss"]
    if evals:
        last = evals[-1]
        want.update(eval_step=last["step"], eval_loss=last["loss"], eval_accuracy=last.get("accuracy"))
        finite = [e for e in evals if e["loss"] is not None]
        if finite:
            b = min(finite, key=lambda e: (e["loss"], e["step"]))
            want.update(best_eval_loss=b["loss"], best_eval_loss_step=b["step"])
        acc = [e for e in evals if e.get("accuracy") is not None]
        if acc:
            b = max(acc, key=lambda e: (e["accuracy"], -e["step"]))
            want.update(best_eval_accuracy=b["accuracy"], best_eval_accuracy_step=b["step"])
    return want


def test_final_and_best_metrics_of_a_classifier(server):
    jid = server.submit(classifier_spec())["id"]
    job = server.wait_state(jid, ("succeeded", "failed", "cancelled"))
    assert job["state"] == "succeeded", job
    evs = server.events(jid)
    want = expected_metrics(job, evs)
    assert want["eval_step"] == 12 and want["best_eval_loss_step"] is not None, want
    assert want["best_eval_accuracy"] is not None, want
    assert job["metrics"] == want, (job["metrics"], want)
    listed = {j["id"]: j for j in server.get("/v1/jobs").json()["jobs"]}
    assert listed[jid]["metrics"] == want

    # grad_norm and time: rank 0's loss events, per step
    m = server.get(f"/v1/jobs/{jid}/metrics").json()
    r0 = sorted((e for e in evs if e["event"] == "loss" and e["rank"] == 0), key=lambda e: e["step"])
    assert m["grad_norm"]["step"] == [e["step"] for e in r0] == list(range(1, 13))
    assert m["grad_norm"]["grad_norm"] == pytest.approx([e["grad_norm"] for e in r0], rel=1e-15)
    assert m["time"]["step"] == list(range(1, 13))
    assert m["time"]["time"] == pytest.approx([e["ts"] for e in r0], rel=1e-15)
    assert m["time"]["time"] == sorted(m["time"]["time"])


def test_a_job_without_eval_has_null_eval_metrics(server):
    """mse without eval and without grad_clip: only step and loss; an empty grad_norm."""
    jid = server.submit(seed_spec(steps=4, epochs=None, log_every=1))["id"]
    job = server.wait_state(jid, ("succeeded", "failed", "cancelled"))
    assert job["state"] == "succeeded", job
    assert job["metrics"]["step"] == 4 and job["metrics"]["loss"] == job["loss"] is not None
    assert all(job["metrics"][k] is None for k in FIELDS[2:]), job["metrics"]
    m = server.get(f"/v1/jobs/{jid}/metrics").json()
    assert m["grad_norm"] == {"step": [], "grad_norm": []}
    assert m["time"]["step"] == [1, 2, 3, 4]


def test_regression_eval_has_no_accuracy(server):
    jid = server.submit(seed_spec(steps=6, epochs=None, log_every=1, eval={
        "data": {"type": "synthetic", "samples": 20, "seed": 3}, "every_steps": 3}))["id"]
    job = server.wait_state(jid, ("succeeded", "failed", "cancelled"))
    assert job["state"] == "succeeded", job
    want = expected_metrics(job, server.events(jid))
    assert want["eval_step"] == 6 and want["best_eval_loss"] is not None
    assert want["eval_accuracy"] is None and want["best_eval_accuracy"] is None
    assert job["metrics"] == want


def test_the_migration_fills_the_metrics_of_older_jobs(make_server):
    """A database whose jobs were stored before the metrics columns (the columns dropped):
    the migration's own SQL (schema/migrations/*_job_metrics.sql, as the build embeds it)
    computes each job's metrics from its stored eval events, equal to what the writer
    kept. Run here by hand, because later migrations follow it: rolling user_version back
    would run theirs again too."""
    srv = make_server(cpu_slots=2)
    jid = srv.submit(classifier_spec())["id"]
    assert srv.wait_state(jid, ("succeeded", "failed", "cancelled"))["state"] == "succeeded"
    before = srv.job(jid)["metrics"]
    assert srv.stop() == 0
    (sql_file,) = (REPO / "schema" / "migrations").glob("*_job_metrics.sql")
    db = sqlite3.connect(srv.db)
    cols = [r[1] for r in db.execute("PRAGMA table_info(jobs)")]
    added = [c for c in cols if c.startswith(("eval_", "best_eval_"))]
    assert len(added) == 7, cols
    for c in added:
        db.execute(f"ALTER TABLE jobs DROP COLUMN {c}")
    db.commit()
    db.executescript(sql_file.read_text())
    db.commit()
    db.close()
    srv.start()
    assert srv.job(jid)["metrics"] == before
