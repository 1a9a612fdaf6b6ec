"""conftest.py — the fault tests (tests/faults/) use the API tests' helpers: the real
`ddpd serve` on an ephemeral port (Server, make_server, wait_until, /proc helpers, exit
code 77 when nothing ran). They are loaded from tests/api/conftest.py under another
module name and re-exported here, so a test imports them with `from conftest import ...`.
Environment as there: DDPD_BIN, DDPD_TEST_TMP, DDPD_KEEP_TMP."""
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("ddpd_api_conftest", Path(__file__).resolve().parents[1] / "api" / "conftest.py")
_api = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_api)
globals().update({k: v for k, v in vars(_api).items() if not k.startswith("__")})


def binary_has_faultvfs():
    """True when ddpd was built with -DDDPD_FAULT_INJECTION=ON (tests/faults/faultvfs.c)."""
    b = bin_dir()  # noqa: F821 (from the API conftest)
    return b is not None and b"DDPD_FAULT_SQLITE" in (b / "ddpd").read_bytes()
