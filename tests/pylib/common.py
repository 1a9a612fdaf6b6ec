"""common.py — what every suite shares: where the binaries and temporary folders are, a
test's working folder (removed after a pass, kept after a failure or with DDPD_KEEP_TMP=1),
and exit code 77 (ctest's SKIP_RETURN_CODE) for a session in which every test was skipped.

Environment: DDPD_BIN = folder holding `ddpd` and `ddpd-worker` (default: <repo>/build),
DDPD_TEST_TMP = where temporary folders go (default: the system temp dir)."""
import os
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIP_PLUGIN = "ddpd-skip77"


def bin_dir():
    """The folder holding ddpd and ddpd-worker, or None when they are not built."""
    d = os.environ.get("DDPD_BIN")
    c = Path(d) if d else REPO / "build"
    if (c / "ddpd").is_file() and os.access(c / "ddpd", os.X_OK) and (c / "ddpd-worker").is_file():
        return c.resolve()
    return None


def tmp_root():
    """DDPD_TEST_TMP (created), or None for the system temp dir."""
    t = os.environ.get("DDPD_TEST_TMP")
    if t:
        Path(t).mkdir(parents=True, exist_ok=True)
    return t or None


def make_workdir(prefix="ddpd-"):
    """A fresh folder under DDPD_TEST_TMP (or the system temp dir)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=tmp_root()))


class SkipCode:
    """A session in which every test was skipped exits with 77 (ctest's SKIP_RETURN_CODE),
    so a missing binary, torch or docker shows as 'skipped'; also remembers which tests
    failed, so their folders are kept."""

    def __init__(self):
        self.passed = self.failed = self.skipped = 0
        self.failed_ids = set()

    def pytest_runtest_logreport(self, report):
        if report.skipped:
            self.skipped += 1
        elif report.failed:
            self.failed += 1
            self.failed_ids.add(report.nodeid)
        elif report.passed and report.when == "call":
            self.passed += 1

    def pytest_sessionfinish(self, session, exitstatus):
        if self.skipped and not self.passed and not self.failed and int(exitstatus) == 0:
            session.exitstatus = 77


def install_skip_code(config):
    if not config.pluginmanager.has_plugin(SKIP_PLUGIN):
        config.pluginmanager.register(SkipCode(), SKIP_PLUGIN)


def folder_for_test(request, prefix="ddpd-"):
    """Generator behind the suites' `work` fixtures: a fresh folder for one test, removed
    after a pass, kept after a failure (or always with DDPD_KEEP_TMP=1)."""
    d = make_workdir(prefix)
    yield d
    plugin = request.config.pluginmanager.get_plugin(SKIP_PLUGIN)
    failed = plugin is None or request.node.nodeid in plugin.failed_ids
    if not failed and os.environ.get("DDPD_KEEP_TMP") != "1":
        shutil.rmtree(d, ignore_errors=True)
