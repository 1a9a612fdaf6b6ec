"""conftest.py — the parity tests' fixture `work` (a test's folder under DDPD_TEST_TMP,
or pytest's tmp_path) and exit code 77 when every test was skipped. Helpers are in
pylib.parity (single-rank) and pylib.ddp (multi-rank)."""
import pytest

from pylib.common import install_skip_code
from pylib.parity import workdir


def pytest_configure(config):
    install_skip_code(config)


@pytest.fixture
def work(request, tmp_path):
    """A fresh folder for one test (pylib.parity.workdir)."""
    yield from workdir(request, tmp_path)
