#!/usr/bin/python3
"""bench/sweep.py — an asha sweep against the grid of the same trials (issue 31), through one
`ddpd serve` with 2 CPU slots (max_parallel 2):

  bench/sweep.py --build build            # one grid, one asha (~ a few minutes)
  bench/sweep.py --build build --check    # exit 1 when a goal is missed

The trials: an MLP classifier (16 -> 256 -> 256 -> 4, cross_entropy, adamw with a cosine
schedule, batch 128) on synthetic data (4,096 samples; eval on 1,024 of the same teacher
every 30 steps); the 27 trials are the grid 3 x 3 x 3 of optimizer.lr,
optimizer.weight_decay and init.seed. The grid runs each trial for 810 steps; asha (no
count: the grid's trials) has rungs 30, 90, 270, 810 (min_steps 30, reduction_factor 3,
max_steps 810): 27 -> 9 -> 3 -> 1. Wall time of
a sweep: its finished_at - created_at. Metric eval_accuracy (mode max; --metric
eval_loss for min). The eval rows are the first 1,024 training rows (synthetic data has
one teacher per seed), so eval_loss falls towards 0 and a relative gap in it is
ill-conditioned; accuracy is the default. Goals: asha's best metric within 2 % of the
grid's best, in <= 0.4 of the grid's wall time. See bench/README.md."""
import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# bench/ holds a tokenize.py that would shadow the standard library's (pytest imports it).
sys.path = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO / "tests"))

GOAL_TIME, GOAL_METRIC = 0.4, 0.02


def base_spec():
    return {"name": "bench-sweep", "world_size": 1, "device": "cpu",
            "model": [{"type": "linear", "in": 16, "out": 256}, {"type": "relu"},
                      {"type": "linear", "in": 256, "out": 256}, {"type": "relu"},
                      {"type": "linear", "in": 256, "out": 4}],
            "loss": "cross_entropy",
            "optimizer": {"type": "adamw", "lr": 0.001, "weight_decay": 0.0,
                          "schedule": {"type": "cosine", "warmup_steps": 5}},
            "data": {"type": "synthetic", "samples": 4096, "seed": 1},
            "eval": {"data": {"type": "synthetic", "samples": 1024, "seed": 1}, "every_steps": 30},
            "init": {"seed": 0},
            "batch_size": 128, "steps": 810, "log_every": 30}


PARAMS = {"optimizer.lr": [0.0003, 0.003, 0.03], "optimizer.weight_decay": [0.0, 0.01, 0.1],
          "init.seed": [0, 1, 2]}


def run_sweep(server, body, timeout=3600):
    r = server.post("/v1/sweeps", json=body)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    deadline = time.monotonic() + timeout
    while True:
        sw = server.get(f"/v1/sweeps/{sid}").json()
        if sw["state"] != "running":
            break
        assert time.monotonic() < deadline, f"sweep {sid} still running after {timeout} s"
        time.sleep(0.5)
    assert sw["state"] == "succeeded" and sw["best"], sw
    jobs = sum(max(1, len(t.get("rungs") or [])) for t in sw["trials"])
    return sw["finished_at"] - sw["created_at"], sw["best"]["metric"], jobs, sw


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--metric", default="eval_accuracy", choices=("eval_accuracy", "eval_loss"))
    a = ap.parse_args()
    os.environ["DDPD_BIN"] = str(Path(a.build).resolve())
    import tempfile

    from pylib.server import Server
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as root:
        server = Server(root, cpu_slots=2).start()
        try:
            mode = "max" if a.metric == "eval_accuracy" else "min"
            common = {"spec": base_spec(), "parameters": PARAMS, "metric": a.metric, "mode": mode,
                      "max_parallel": 2}
            g_time, g_best, g_jobs, _ = run_sweep(server, dict(common, method="grid"))
            print(f"grid: 27 trials, {g_jobs} jobs, {g_time:.1f} s, best {a.metric} {g_best:.6f}", flush=True)
            asha = {"min_steps": 30, "reduction_factor": 3, "max_steps": 810}
            a_time, a_best, a_jobs, sw = run_sweep(server, dict(common, method="asha", asha=asha))
            print(f"asha: 27 trials, {a_jobs} jobs, {a_time:.1f} s, best {a.metric} {a_best:.6f} "
                  f"(trial {sw['best']['index']} {sw['best']['params']})", flush=True)
        finally:
            server.stop()
    ratio = a_time / g_time
    gap = (g_best - a_best if a.metric == "eval_accuracy" else a_best - g_best) / abs(g_best)  # > 0: asha worse
    ok = ratio <= GOAL_TIME and gap <= GOAL_METRIC
    print(f"asha/grid wall time {ratio:.3f} (goal <= {GOAL_TIME}); asha's best {100 * gap:.2f} % worse than the grid's "
          f"(goal <= {100 * GOAL_METRIC:.0f} %): {'met' if ok else 'MISSED'}")
    return 0 if ok or not a.check else 1


if __name__ == "__main__":
    sys.exit(main())
