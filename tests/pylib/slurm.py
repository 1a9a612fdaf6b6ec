"""slurm.py — helpers of the Slurm tests (tests/slurm/): a Slurm command with the cluster's
slurm.conf, its queue, and the ddpd-worker processes that Slurm started for a job name.

SLURM_CONF points at the cluster's slurm.conf; without it, scripts/slurm-up.sh's default
state folder (DDPD_SLURM_DIR or /tmp/ddpd-slurm) is tried.
"""
import os
import subprocess
from pathlib import Path

from pylib.server import proc_stat


def slurm_env():
    env = dict(os.environ)
    if not env.get("SLURM_CONF"):
        c = Path(os.environ.get("DDPD_SLURM_DIR", "/tmp/ddpd-slurm")) / "slurm.conf"
        if c.is_file():
            env["SLURM_CONF"] = str(c)
    return env


def slurm_cmd(*args, timeout=15):
    """stdout of a Slurm command (squeue, sinfo, ...); AssertionError when it fails."""
    r = subprocess.run(list(args), env=slurm_env(), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}"
    return r.stdout


def squeue(name_prefix=""):
    """[(job id, name, state, reason)] of the queue, names starting with name_prefix."""
    out = slurm_cmd("squeue", "--noheader", "--format=%i|%j|%T|%r")
    rows = [ln.split("|", 3) for ln in out.splitlines() if ln.strip()]
    return [tuple(r) for r in rows if len(r) == 4 and r[1].startswith(name_prefix)]


def slurm_workers(name_prefix):
    """{pid: SLURM_PROCID} of the live ddpd-worker processes of Slurm jobs named
    name_prefix*."""
    out = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        st = proc_stat(int(p))
        if not st or not st[3].startswith("ddpd-worker") or st[0] in ("Z", "X"):
            continue
        try:
            env = Path(f"/proc/{p}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        kv = dict(e.decode(errors="replace").split("=", 1) for e in env if b"=" in e)
        if kv.get("SLURM_JOB_NAME", "").startswith(name_prefix) and "SLURM_PROCID" in kv:
            out[int(p)] = int(kv["SLURM_PROCID"])
    return out
