"""conftest.py — the API tests' fixtures, from pylib.server: `work` (a test's folder),
`make_server` and `server` (a real `ddpd serve` on an ephemeral 127.0.0.1 port),
`curl_streams` (event streams through the real curl). Exit code 77 when every test was
skipped."""
from pylib.common import install_skip_code
from pylib.server import curl_streams, make_server, server, work  # noqa: F401 (fixtures)


def pytest_configure(config):
    install_skip_code(config)
