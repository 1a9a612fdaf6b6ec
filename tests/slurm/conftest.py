"""conftest.py — the Slurm tests' fixtures: the API suite's (a real `ddpd serve` on an
ephemeral 127.0.0.1 port, pylib.server) and `slurm`, the cluster's CPUs per node or a skip
when no Slurm answers. Helpers are in pylib.slurm."""
import os
import shutil
import subprocess

import pytest

from pylib.common import install_skip_code
from pylib.server import make_server, work  # noqa: F401 (fixtures)
from pylib.slurm import slurm_cmd, slurm_env


def pytest_configure(config):
    install_skip_code(config)


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
