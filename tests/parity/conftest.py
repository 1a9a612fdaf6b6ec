"""conftest.py — the parity tests' fixture `work` (a test's folder under DDPD_TEST_TMP,
or pytest's tmp_path), exit code 77 when every test was skipped, and the `cpu_only` mark
(the cases the emulated GPU leaves out, DDPD_PARITY_DEVICE=cuda). Helpers are in
pylib.parity (single-rank) and pylib.ddp (multi-rank); the device is pylib.common's."""
import pytest

from pylib.common import install_device_marks, install_skip_code
from pylib.parity import workdir


def pytest_configure(config):
    install_skip_code(config)
    install_device_marks(config)


@pytest.fixture
def work(request, tmp_path):
    """A fresh folder for one test (pylib.parity.workdir)."""
    yield from workdir(request, tmp_path)
