"""conftest.py — the deployment tests' exit code: a session in which every test was
skipped (no docker-compose, no built ddpd) exits with 77, ctest's SKIP_RETURN_CODE, as
tests/api does."""


class _SkipCode:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def pytest_runtest_logreport(self, report):
        if report.skipped:
            self.skipped += 1
        elif report.failed:
            self.failed += 1
        elif report.passed and report.when == "call":
            self.passed += 1

    def pytest_sessionfinish(self, session, exitstatus):
        if self.skipped and not self.passed and not self.failed and int(exitstatus) == 0:
            session.exitstatus = 77


def pytest_configure(config):
    if not config.pluginmanager.has_plugin("ddpd-deploy-skip77"):
        config.pluginmanager.register(_SkipCode(), "ddpd-deploy-skip77")
