"""test_worker_rank.py — the worker's side of the Slurm launcher, without Slurm: a stdin
document without `rank` takes it from SLURM_PROCID, SLURM_NTASKS must match world_size,
and each mistake is an `error` event (exit code 2) that names what was wrong
(CONTRACT.md §5)."""
import json
import os
import subprocess

import pytest

from pylib import server as api


def run_worker(tmp_path, env_extra, rank=None):
    b = api.bin_dir()
    if b is None:
        pytest.skip("ddpd-worker is not built (set DDPD_BIN)")
    spec = api.seed_spec(world_size=1, epochs=None, steps=5)
    doc = {"job": 1, "attempt": 1, "world_size": 1, "comm": None, "spec": spec, "data_dir": str(tmp_path),
           "out_dir": str(tmp_path / "out"), "resume": None}
    if rank is not None:
        doc["rank"] = rank
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(env_extra)
    p = subprocess.run([str(b / "ddpd-worker")], input=json.dumps(doc), env=env, capture_output=True, text=True,
                       timeout=60)
    return p.returncode, [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip()]


def test_rank_from_slurm_procid(tmp_path):
    rc, evs = run_worker(tmp_path, {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    assert rc == 0, evs
    assert evs[0]["event"] == "start" and evs[0]["rank"] == 0 and evs[-1]["event"] == "done"


@pytest.mark.parametrize("env,message", [
    ({}, "rank: the job document has no rank and SLURM_PROCID is not set"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"},
     "world_size: the job document says 1 but Slurm started 2 tasks (SLURM_NTASKS) for rank 0"),
    ({"SLURM_PROCID": "3", "SLURM_NTASKS": "1"}, "rank: SLURM_PROCID '3' is not a rank in [0, 1)"),
    ({"SLURM_PROCID": "x", "SLURM_NTASKS": "1"}, "rank: SLURM_PROCID 'x' is not a rank in [0, 1)"),
])
def test_slurm_mistakes_are_named(tmp_path, env, message):
    rc, evs = run_worker(tmp_path, env)
    assert rc == 2, evs
    assert evs[-1]["event"] == "error" and evs[-1]["kind"] == "spec" and evs[-1]["message"] == message, evs


def test_a_document_with_a_rank_ignores_slurm(tmp_path):
    # The local launcher's documents name the rank; a Slurm environment around it changes nothing.
    rc, evs = run_worker(tmp_path, {"SLURM_PROCID": "5", "SLURM_NTASKS": "9"}, rank=0)
    assert rc == 0 and evs[0]["rank"] == 0, evs
