"""Checkpoint pruning under SIGKILL (issue 15, item 11): rank 0 of a job that writes a
checkpoint every step and keeps the last 2 is killed at random moments, so that kills land
while a checkpoint is being written (`ckpt-N.tmp`), renamed into place, or an old one is
being pruned (`ckpt-M.del`). After every kill at least 2 whole checkpoints remain (never
fewer than keep_last once that many were written; no half-deleted folder that reads as a
checkpoint), and resuming from the newest one in the same folder works and cleans up the
leftovers of the kill."""
import json
import os
import random
import re
import subprocess
import time

from pylib.server import bin_dir, heavy_spec, st_decode, wait_until

TRIALS = 20
KEEP = 2
COMPLETE = re.compile(r"^ckpt-(\d+)$")


def listing(folder):
    return sorted(os.listdir(folder))


def complete_steps(names):
    return sorted(int(m.group(1)) for m in map(COMPLETE.match, names) if m)


def test_kills_while_pruning_never_leave_fewer_than_keep_last(make_server, work):
    srv = make_server(cpu_slots=1)
    rng = random.Random(15)
    spec = heavy_spec(1, steps=300, name="prune-kill", optimizer={"type": "sgd", "lr": 0.01, "momentum": 0.9},
                      checkpoint={"every_steps": 1, "keep_last": KEEP})
    spec_file = work / "spec.json"
    spec_file.write_text(json.dumps(spec))
    rows = []
    for t in range(TRIALS):
        jid = srv.submit(spec)["id"]
        j = srv.wait_running(jid)
        folder = srv.jobs_dir / str(jid)
        wait_until(lambda: len(complete_steps(listing(folder))) >= KEEP + 1 or srv.job(jid)["state"] != "running",
                   60, f"trial {t}: {KEEP + 1} checkpoints")
        time.sleep(rng.uniform(0, 0.25))  # a random point of the write/prune cycle, not a timer race
        try:
            os.kill(j["ranks"][0]["pid"], 9)
        except ProcessLookupError:
            pass
        j = srv.wait_state(jid, ("succeeded", "failed"), timeout=60)
        names = listing(folder)
        steps = complete_steps(names)
        # Never fewer than keep_last whole checkpoints, and each one whole.
        assert len(steps) >= KEEP, (t, names)
        for s in steps:
            for f in ("model.safetensors", "optim.safetensors"):
                st_decode((folder / f"ckpt-{s}" / f).read_bytes())
        leftovers = [n for n in names if n.startswith("ckpt-") and not COMPLETE.match(n)]
        assert all(n.endswith((".tmp", ".del")) for n in leftovers), names
        rows.append((t, j["state"], steps, leftovers))
        if j["state"] == "succeeded":
            continue  # the kill came after the end: nothing to resume
        # Resume from the newest in the same folder: it runs to the end, prunes to keep_last
        # and removes what the kill left behind.
        r = subprocess.run([str(bin_dir() / "ddpd"), "run", "--out", str(folder), "--resume",
                            str(folder / f"ckpt-{steps[-1]}"), str(spec_file)],
                           capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert r.returncode == 0, (t, names, r.stderr[-2000:])
        after = listing(folder)
        assert [n for n in after if n.startswith("ckpt-")] == [f"ckpt-{298}", f"ckpt-{299}"], (t, names, after)
    tmp = sum(1 for r in rows if any(n.endswith(".tmp") for n in r[3]))
    dele = sum(1 for r in rows if any(n.endswith(".del") for n in r[3]))
    print(f"{TRIALS} kills: {tmp} with a checkpoint being written, {dele} with one being pruned; "
          f"fewest whole checkpoints left {min(len(r[2]) for r in rows)}")
