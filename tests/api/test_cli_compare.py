"""test_cli_compare.py — `ddpd compare ID ID..` (server/client_compare.c) against a real
`ddpd serve`: the table of each job's final and best metrics equals the jobs' `metrics`
from the API, the spec fields listed are exactly those the test made differ (numbers
without float noise), accuracy columns only for classifiers, "The specs are the same."
when nothing differs, and the usage errors. (What it prints of the server's answers goes
through termsafe; the server itself refuses control characters in a spec's strings.)"""
from pylib.server import seed_spec
from test_cli import cli

FINAL = ("succeeded", "failed", "cancelled")


def classifier(name, **over):
    s = seed_spec(
        name=name, steps=60, epochs=None, log_every=5, batch_size=16, loss="cross_entropy",
        model=[{"type": "linear", "in": 10, "out": 16}, {"type": "relu"}, {"type": "linear", "in": 16, "out": 3}],
        optimizer={"type": "sgd", "lr": 0.1}, data={"type": "synthetic", "samples": 400, "seed": 1},
        eval={"data": {"type": "synthetic", "samples": 50, "seed": 2}, "every_steps": 20})
    s.update(over)
    return s


def run_all(srv, specs):
    ids = [srv.submit(s)["id"] for s in specs]
    jobs = [srv.wait_state(i, FINAL) for i in ids]
    assert all(j["state"] == "succeeded" for j in jobs), jobs
    return ids, jobs


def sections(out):
    """stdout -> (metrics rows split on 2+ spaces, diff rows split likewise)."""
    import re
    table, _, diff = out.partition("\n\n")
    split = lambda block: [re.split(r"\s{2,}", line.rstrip()) for line in block.strip().splitlines()]
    return split(table), split(diff)


def loss_cell(m, key, step_key=None):
    v = m[key]
    if v is None:
        return "-"
    return f"{v:.4g}" + (f" @{m[step_key]}" if step_key else "")


def pct_cell(m, key, step_key):
    v = m[key]
    return "-" if v is None else f"{100 * v:.2f}% @{m[step_key]}"


def test_compare_prints_metrics_and_only_the_differing_fields(server):
    ids, jobs = run_all(server, [
        classifier("cmp-a"),
        classifier("cmp-b", optimizer={"type": "sgd", "lr": 0.05}),
        classifier("cmp-c", model=[{"type": "linear", "in": 10, "out": 32}, {"type": "relu"},
                                   {"type": "linear", "in": 32, "out": 3}]),
    ])
    r = cli(server, "compare", *map(str, ids))
    assert r.returncode == 0, r.stderr
    table, diff = sections(r.stdout)
    assert table[0] == ["JOB", "NAME", "STATE", "STEP", "LOSS", "EVAL LOSS", "BEST EVAL LOSS", "EVAL ACC",
                        "BEST EVAL ACC"], r.stdout
    for row, j in zip(table[1:], jobs, strict=True):
        m = j["metrics"]
        assert m["best_eval_accuracy"] is not None and m["eval_step"] == 60, m
        assert row == [str(j["id"]), j["name"], "succeeded", "60", f"{m['loss']:.4g}",
                       loss_cell(m, "eval_loss", "eval_step"), loss_cell(m, "best_eval_loss", "best_eval_loss_step"),
                       pct_cell(m, "eval_accuracy", "eval_step"),
                       pct_cell(m, "best_eval_accuracy", "best_eval_accuracy_step")], (row, m)
    assert diff[0] == ["FIELD"] + [f"#{i}" for i in ids], r.stdout
    assert diff[1:] == [
        ["model[0].out", "16", "16", "32"],
        ["model[2].in", "16", "16", "32"],
        ["name", '"cmp-a"', '"cmp-b"', '"cmp-c"'],
        ["optimizer.lr", "0.1", "0.05", "0.1"],
    ], r.stdout


def test_compare_without_eval_and_with_the_same_specs(server):
    """mse jobs without eval: no accuracy columns, '-' for the eval; the same spec twice:
    nothing differs; a field only one spec has (grad_clip) is listed as not set in the other."""
    spec = seed_spec(name="same", steps=10, epochs=None, log_every=5)
    ids, jobs = run_all(server, [spec, spec, dict(spec, grad_clip=0.5)])
    r = cli(server, "compare", str(ids[0]), str(ids[1]))
    assert r.returncode == 0, r.stderr
    table, diff = sections(r.stdout)
    assert table[0] == ["JOB", "NAME", "STATE", "STEP", "LOSS", "EVAL LOSS", "BEST EVAL LOSS"], r.stdout
    assert table[1][5:] == ["-", "-"] and table[2][5:] == ["-", "-"], r.stdout
    assert diff == [["The specs are the same."]], r.stdout
    r = cli(server, "compare", str(ids[0]), str(ids[2]))
    assert r.returncode == 0, r.stderr
    _, diff = sections(r.stdout)
    assert diff[1:] == [["grad_clip", "(not set)", "0.5"]], r.stdout


def test_usage_errors(server):
    jid = server.submit(seed_spec(steps=2, epochs=None))["id"]
    r = cli(server, "compare", str(jid))
    assert r.returncode == 2 and "expected 2 to 50 job ids, got 1" in r.stderr, r.stderr
    r = cli(server, "compare", str(jid), str(jid))
    assert r.returncode == 2 and f"job {jid} is given twice" in r.stderr, r.stderr
    r = cli(server, "compare", str(jid), "x")
    assert r.returncode == 2 and "expected a job id" in r.stderr, r.stderr
    r = cli(server, "compare", str(jid), "999999")
    assert r.returncode == 1 and "999999" in r.stderr, r.stderr
