"""conftest.py — the deployment tests' exit code: a session in which every test was
skipped (no docker-compose, no built ddpd) exits with 77, ctest's SKIP_RETURN_CODE."""
from pylib.common import install_skip_code


def pytest_configure(config):
    install_skip_code(config)
