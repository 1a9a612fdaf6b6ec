"""conftest.py — the multi-host tests' fixtures: `hosts`, four namespaced hosts of
scripts/hosts-up.sh for the whole session (a skip where namespaces cannot be made),
removed at the end however the session ends, with a check after every test that no
process of it is left on any host; `work`, a folder per test. Helpers: hostlib.py."""
import pytest

import hostlib
from pylib.common import folder_for_test, install_skip_code
from pylib.server import make_server  # noqa: F401 (fixture)

NHOSTS = 4


def pytest_configure(config):
    install_skip_code(config)


@pytest.fixture(scope="session")
def _hosts_session():
    why = hostlib.why_no_namespaces()
    if why:
        pytest.skip(f"no network namespaces here: {why}")
    hostlib.down()  # an earlier session killed before its finalizer
    why = hostlib.up(NHOSTS)
    if why:
        hostlib.down()
        pytest.skip(f"cannot make namespaced hosts: {why}")
    yield NHOSTS
    rc, err = hostlib.down()
    assert rc == 0, f"hosts-down.sh: {err}"


@pytest.fixture
def hosts(_hosts_session):
    """The number of hosts up (1..NHOSTS); after the test, nothing of it may be left on them."""
    yield _hosts_session
    left = hostlib.wait_no_leftovers(_hosts_session)
    assert not left, "processes left on the hosts after the test:\n" + "\n".join(left)


@pytest.fixture
def work(request):
    yield from folder_for_test(request, "ddpd-multihost-")
