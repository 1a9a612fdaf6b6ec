"""conftest.py — the fault tests' fixtures: the API suite's (pylib.server: a test's folder,
a real `ddpd serve` on an ephemeral port). Exit code 77 when every test was skipped."""
from pylib.common import install_skip_code
from pylib.server import curl_streams, make_server, server, work  # noqa: F401 (fixtures)


def pytest_configure(config):
    install_skip_code(config)
