#!/usr/bin/python3
"""bench/preempt.py — preemption latency (issue 32), through one `ddpd serve` with 2 CPU
slots:

  bench/preempt.py --build build            # 5 rounds (~1 minute)
  bench/preempt.py --build build --check    # exit 1 when the goal is missed

Each round: the GPT of examples/gpt-char.json (2 ranks, 2 layers of width 64, block 64,
batch 16; without its eval, on random bytes) runs at priority 10 until it has logged 5
steps; then a 2-rank job of priority 90 is submitted. Latency: from that submit's answer to the moment the low job's
slots are free (GET /v1/devices polled every 5 ms shows no CPU slot held by it). Its
step time is the median interval between its loss events before the submit. Goal: the
latency is at most 2 s plus one step. Printed per round and as the median; the floor
beside it is the step time itself (a rank stops only after the optimizer step it is in)."""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO / "tests"))

GOAL_S = 2.0


def gpt_spec(priority, steps):
    s = json.loads((REPO / "examples" / "gpt-char.json").read_text())
    s.pop("eval", None)
    s.update(name=f"bench-preempt-{priority}", priority=priority, steps=steps, log_every=1,
             data={"type": "tokens", "path": "bench/train.bin", "block_size": 64, "seed": 1})
    return s


def slots_of(server, jid):
    d = server.get("/v1/devices").json()
    return [c for c in d.get("cpu_slots", []) if c.get("job") == jid]


def one_round(server):
    low = server.submit(gpt_spec(10, 1_000_000))["id"]
    stamps = []
    deadline = time.monotonic() + 120
    while len(stamps) < 6:
        assert time.monotonic() < deadline, "the low job logged no steps"
        j = server.job(low)
        if j.get("step") and (not stamps or j["step"] != stamps[-1][0]):
            stamps.append((j["step"], time.monotonic()))
        time.sleep(0.002)
    steps = [(b[1] - a[1]) / max(1, b[0] - a[0]) for a, b in zip(stamps, stamps[1:])]
    step_s = statistics.median(steps)
    t0 = time.monotonic()
    high = server.submit(gpt_spec(90, 3))["id"]
    while slots_of(server, low):
        assert time.monotonic() - t0 < 120, "the low job kept its slots"
        time.sleep(0.005)
    latency = time.monotonic() - t0
    server.wait_state(high, ("succeeded", "failed", "cancelled"), timeout=300)
    server.post(f"/v1/jobs/{low}/cancel")
    server.wait_state(low, ("succeeded", "failed", "cancelled"), timeout=300)
    return latency, step_s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    os.environ["DDPD_BIN"] = str(Path(a.build).resolve())
    import tempfile

    import numpy as np

    from pylib.server import Server
    with tempfile.TemporaryDirectory(prefix="bench-preempt-") as root:
        server = Server(root, cpu_slots=2).start()
        try:
            (server.data_dir / "bench").mkdir()
            np.random.default_rng(1).integers(0, 256, 200_000, dtype=np.uint16).tofile(
                server.data_dir / "bench" / "train.bin")
            rows = [one_round(server) for _ in range(a.rounds)]
        finally:
            server.stop()
    print("round  latency_s  step_s  goal_s (2 s + one step)")
    for i, (lat, st) in enumerate(rows):
        print(f"{i + 1:5d}  {lat:9.3f}  {st:6.3f}  {GOAL_S + st:6.3f}")
    lat = statistics.median(r[0] for r in rows)
    st = statistics.median(r[1] for r in rows)
    ok = lat <= GOAL_S + st
    print(f"median latency {lat:.3f} s, step {st:.3f} s, goal {GOAL_S + st:.3f} s: {'met' if ok else 'MISSED'}")
    return 0 if ok or not a.check else 1


if __name__ == "__main__":
    sys.exit(main())
