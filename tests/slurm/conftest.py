"""conftest.py — the Slurm tests reuse the API tests' helpers (tests/api/conftest.py: a real
`ddpd serve` on an ephemeral 127.0.0.1 port, bounded waits, exit code 77 when everything
was skipped) and add what Slurm needs: is a Slurm up (scripts/slurm-up.sh), its queue,
and the ddpd-worker processes that Slurm started for a job name.

SLURM_CONF points at the cluster's slurm.conf; without it, scripts/slurm-up.sh's default
state folder (DDPD_SLURM_DIR or /tmp/ddpd-slurm) is tried.
"""
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("ddpd_api_helpers", Path(__file__).resolve().parents[1] / "api" / "conftest.py")
api = importlib.util.module_from_spec(_spec)
sys.modules["ddpd_api_helpers"] = api
_spec.loader.exec_module(api)

# The fixtures and the skip-77 hook of the API tests.
work = api.work
make_server = api.make_server
pytest_configure = api.pytest_configure


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


@pytest.fixture(scope="session")
def slurm():
    """The cluster's CPUs per node; skips when no Slurm answers (CI brings one up)."""
    if shutil.which("srun") is None or shutil.which("squeue") is None:
        pytest.skip("Slurm is not installed (scripts/install-deps.sh: slurm-wlm, munge)")
    try:
        out = slurm_cmd("sinfo", "--noheader", "--format=%t %c", timeout=10)
    except (AssertionError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"no Slurm answers (scripts/slurm-up.sh starts one): {e}")
    # The servers the tests start (and their sruns) use the same cluster.
    os.environ["SLURM_CONF"] = slurm_env().get("SLURM_CONF", "")
    states = [ln.split() for ln in out.splitlines() if ln.strip()]
    up = [int(c) for st, c in states if st.rstrip("*~#") in ("idle", "mix", "alloc")]
    if not up:
        pytest.skip(f"Slurm has no node up: {out.strip()!r}")
    return max(up)


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
        st = api.proc_stat(int(p))
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
