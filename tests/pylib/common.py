"""common.py — what every suite shares: where the binaries and temporary folders are, a
test's working folder (removed after a pass, kept after a failure or with DDPD_KEEP_TMP=1),
and exit code 77 (ctest's SKIP_RETURN_CODE) for a session in which every test was skipped.

Also the one place that says which device the parity suites train on (`parity_device`):
the CPU, or the emulated GPU, where every `ddpd run` of pylib.parity and pylib.ddp trains
with `"device": "cuda"` and the NCCL backend on as many emulated GPUs as it has ranks.

Environment: DDPD_BIN = folder holding `ddpd` and `ddpd-worker` (default: <repo>/build),
DDPD_TEST_TMP = where temporary folders go (default: the system temp dir),
DDPD_PARITY_DEVICE = `cpu` (default) or `cuda`: the emulated CUDA device of DDPD_BIN's
libddpd-cuda-emu.so (tests/CMakeLists.txt registers the parity files again as
`parity_emu.<file>` with it); DDPD_PARITY_GPU=real with DDPD_PARITY_GPUS=N runs `cuda` on a
host's N real GPUs instead (scripts/gpu-check.sh)."""
import copy
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


# ---------------------------------------------------------------------------------------
# the device of the parity runs

EMU_MODULE = "libddpd-cuda-emu.so"


def parity_device():
    """"cpu" or "cuda" (DDPD_PARITY_DEVICE); anything else is a mistake in the test setup."""
    d = os.environ.get("DDPD_PARITY_DEVICE", "cpu") or "cpu"
    if d not in ("cpu", "cuda"):
        raise ValueError(f"DDPD_PARITY_DEVICE={d!r}: expected cpu or cuda")
    return d


def on_emulated_gpu():
    return parity_device() == "cuda"


def emu_module():
    """The emulated CUDA module beside ddpd, or None when it was not built."""
    d = bin_dir()
    p = d / EMU_MODULE if d else None
    return p if p is not None and p.is_file() else None


def real_gpus():
    """With DDPD_PARITY_GPU=real (scripts/gpu-check.sh on a GPU host) the suites run on the
    real devices, DDPD_PARITY_GPUS of them, through the module DDPD_CUDA_PLUGIN names (or
    the one beside ddpd-worker): the number of GPUs; else None (the emulated GPU)."""
    if os.environ.get("DDPD_PARITY_GPU") != "real":
        return None
    return max(1, int(os.environ.get("DDPD_PARITY_GPUS", "1")))


def device_spec(spec, world=None):
    """The spec as the parity device runs it: unchanged on the CPU; on the GPU a copy with
    `"device": "cuda"` and `ddp.backend` `"nccl"` (whatever the test wrote: the tests are
    written once, for both). On real GPUs a group of more ranks than GPUs shares them
    through `ddp.backend` `"cpu"`, since NCCL takes a GPU per rank."""
    if not on_emulated_gpu() or spec is None:
        return spec
    s = copy.deepcopy(spec)
    s["device"] = "cuda"
    ranks = world or s.get("world_size", 1)
    gpus = real_gpus()
    s["ddp"] = dict(s.get("ddp") or {}, backend="cpu" if gpus is not None and ranks > gpus else "nccl")
    return s


def device_env(env, world):
    """`env` (changed in place and returned) for a `ddpd run` of `world` ranks: on the
    emulated GPU the module (DDPD_CUDA_PLUGIN) and one emulated device per rank
    (DDPD_CUDA_EMU), all of them visible to every rank, as on a host with `world` GPUs; on
    real GPUs (real_gpus) the environment as it is."""
    if on_emulated_gpu() and real_gpus() is not None:
        env.pop("DDPD_CUDA_EMU", None)
    elif on_emulated_gpu():
        m = emu_module()
        if m is None:
            import pytest
            pytest.skip(f"{EMU_MODULE} is not built in DDPD_BIN (DDPD_PARITY_DEVICE=cuda runs on it)")
        env["DDPD_CUDA_PLUGIN"] = str(m)
        env["DDPD_CUDA_EMU"] = str(max(1, int(world)))
        env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


CPU_ONLY = "cpu_only"


class DeviceMarks:
    """`@pytest.mark.cpu_only("why")` (or `marks=` of a pytest.param): the test or case is
    skipped on the emulated GPU, saying why. The one list of what the emulated runs leave
    out: cases that test host code only (data readers, checks made before a device opens,
    file modes), the PyTorch reference alone, or that would take minutes on the emulator
    while smaller cases cover what they compute."""

    def pytest_runtest_setup(self, item):
        m = item.get_closest_marker(CPU_ONLY)
        if m is not None and on_emulated_gpu():
            import pytest
            pytest.skip("CPU only: " + (m.args[0] if m.args else "no reason given"))


def install_device_marks(config):
    config.addinivalue_line("markers", f"{CPU_ONLY}(reason): skipped when DDPD_PARITY_DEVICE=cuda (pylib.common)")
    if not config.pluginmanager.has_plugin("ddpd-device-marks"):
        config.pluginmanager.register(DeviceMarks(), "ddpd-device-marks")


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
