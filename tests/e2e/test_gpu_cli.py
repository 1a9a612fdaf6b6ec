"""test_gpu_cli.py — the worker's GPU-facing command lines, on any machine: `--devices`
prints the visible CUDA devices as one JSON array (`[]`, exit 0, without a GPU);
`--issue-id nccl` prints a fresh 128-byte NCCL unique id as 256 hex digits on one JSON line
and stays until its stdin closes; and a `cuda` job on a machine without a GPU fails with a
device error that says so (CONTRACT.md §5, §6). On a GPU machine the last check runs the
job instead (one rank, NCCL): it must succeed.
CUDA, cuBLAS and NCCL live in the module libddpd-cuda.so beside the worker, loaded only when
needed: --version, --plan and (without an NVIDIA driver) --devices load none of them, and a
module that is missing or is not ddpd's makes a cuda job fail with the device exit (4), the
id issuer with exit 1, both naming the module and dlerror()'s reason, and --devices print
[]."""
import json
import os
import re
import subprocess
import time

import pytest

from pylib import parity as h


@pytest.fixture(autouse=True)
def _skip_code(request):
    h.install_skip_code(request.config)


@pytest.fixture
def work(request, tmp_path, _skip_code):
    yield from h.workdir(request, tmp_path, "e2e-gpu-cli-")


def worker():
    return str(h.ddpd_path().parent / "ddpd-worker")


def has_module():
    return (h.ddpd_path().parent / "libddpd-cuda.so").exists()


def driver_present():
    return any(os.path.exists(p) for p in ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/dxg"))


def devices(env=None):
    proc = subprocess.run([worker(), "--devices"], capture_output=True, text=True, timeout=60,
                          env=None if env is None else dict(os.environ, **env))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_devices_format():
    out = devices()
    lines = out.splitlines()
    assert len(lines) == 1, f"--devices should print one JSON array line: {out!r}"
    devs = json.loads(lines[0])
    assert isinstance(devs, list)
    if not driver_present():
        assert devs == [], devs  # no GPU: an empty array, not nothing
    for i, d in enumerate(devs):
        assert d["index"] == i
        assert d["name"] and d["memory"] > 0
        assert d["emulated"] is False, d  # a GPU, not the emulated module's device
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", d["uuid"])


def issue_id():
    """Starts `--issue-id nccl`, returns (process, id hex) once the id line is out."""
    p = subprocess.Popen([worker(), "--issue-id", "nccl"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line:
        p.kill()
        err = p.stderr.read()
        if "built without CUDA or NCCL" in err:
            pytest.skip("this ddpd-worker was built without CUDA/NCCL")
        raise AssertionError(f"--issue-id nccl printed nothing: {err}")
    return p, json.loads(line)["id"]


def test_issue_id_nccl():
    p1, id1 = issue_id()
    p2, id2 = issue_id()
    try:
        assert re.fullmatch(r"[0-9a-f]{256}", id1), id1
        assert id1 != id2  # a fresh id for every attempt
        time.sleep(0.3)
        assert p1.poll() is None  # the bootstrap root stays while stdin is open
    finally:
        for p in (p1, p2):
            p.stdin.close()
    for p in (p1, p2):
        assert p.wait(timeout=10) == 0  # and leaves once it closes


def test_issue_id_unknown_backend():
    proc = subprocess.run([worker(), "--issue-id", "gloo"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "cpu or nccl" in proc.stderr


def test_cuda_job(work):
    spec = {"name": "cuda-cli", "device": "cuda", "model": [{"type": "linear", "in": 4, "out": 2}],
            "loss": "mse", "optimizer": {"type": "sgd", "lr": 0.1},
            "data": {"type": "synthetic", "samples": 16}, "batch_size": 4, "epochs": 1}
    r = h.run_ddpd(spec, work, work / "out", timeout=300)
    events = r.events
    if json.loads(devices()):
        assert r.rc == 0, r.stderr
        assert events[-1]["event"] == "done"
        assert any(e["event"] == "start" and e["device"] == "cuda" for e in events)
        return
    # No GPU: the rank stops with the device-failure exit and an error naming the cause.
    assert r.rc != 0
    errors = [e for e in events if e["event"] == "error"]
    assert errors, r.stdout + r.stderr
    assert errors[0]["kind"] == "device"
    assert "no CUDA device is visible" in errors[0]["message"] or "CPU only" in errors[0]["message"]
    logs = "".join(p.read_text() for p in (work / "out").glob("rank-*.log"))
    assert "Traceback" not in logs and "Segmentation" not in logs
    assert os.path.exists(work / "out")


# What the dynamic loader loads, from LD_DEBUG=files: a line per library, dlopen'd included.
CUDA_LOADED = re.compile(r"file=\S*lib(cuda|cudart|cublas|cublasLt|nccl|ddpd-cuda)[.-]\S*")


def loaded_cuda(args, stdin=""):
    env = dict(os.environ, LD_DEBUG="files")
    proc = subprocess.run([worker(), *args], input=stdin, capture_output=True, text=True, timeout=60,
                          env=env)
    assert "file=" in proc.stderr, "LD_DEBUG gave no trace: the check would see nothing"
    return proc, sorted({m.group(0) for m in CUDA_LOADED.finditer(proc.stderr)})


def test_cpu_paths_load_no_cuda():
    proc, libs = loaded_cuda(["--version"])
    assert proc.returncode == 0 and proc.stdout.startswith("ddpd-worker "), proc.stderr[-2000:]
    assert not libs, f"--version loaded {libs}"
    plan = json.dumps({"spec": {"name": "p", "world_size": 2, "model": [{"type": "linear", "in": 2, "out": 1}],
                                "loss": "mse", "optimizer": {"type": "sgd", "lr": 0.1},
                                "data": {"type": "synthetic", "samples": 8}, "batch_size": 2,
                                "epochs": 1},
                       "data_dir": ".", "world_size": 2})
    proc, libs = loaded_cuda(["--plan"], plan + "\n")
    assert proc.returncode == 0 and '"batches"' in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert not libs, f"--plan loaded {libs}"
    if not driver_present():
        proc, libs = loaded_cuda(["--devices"])
        assert proc.returncode == 0 and proc.stdout == "[]\n", proc.stdout
        assert not libs, f"--devices loaded {libs} on a machine without an NVIDIA driver"


def cuda_job_doc(out):
    spec = {"name": "cuda-module", "device": "cuda", "model": [{"type": "linear", "in": 4, "out": 2}],
            "loss": "mse", "optimizer": {"type": "sgd", "lr": 0.1},
            "data": {"type": "synthetic", "samples": 16}, "batch_size": 4, "epochs": 1}
    return json.dumps({"world_size": 1, "rank": 0, "spec": spec, "data_dir": str(out),
                       "out_dir": str(out / "out")})


# A file that is not there, and a library that is not ddpd's module (the C library's libm,
# found by the loader's own search).
BAD_MODULES = [("/nonexistent/libddpd-cuda.so", "No such file"), ("libm.so.6", "ddpd_cuda_plugin")]


@pytest.mark.parametrize("module,why", BAD_MODULES)
def test_bad_module(work, module, why):
    if not has_module():
        pytest.skip("this ddpd-worker was built without CUDA: there is no module to replace")
    env = dict(os.environ, DDPD_CUDA_PLUGIN=module)
    job = subprocess.run([worker()], input=cuda_job_doc(work), capture_output=True, text=True,
                         timeout=120, env=env)
    assert job.returncode == 4, job.stdout + job.stderr  # the device-failure exit
    errors = [e for e in map(json.loads, job.stdout.splitlines()) if e["event"] == "error"]
    assert errors and errors[0]["kind"] == "device", job.stdout
    assert module in errors[0]["message"] and why in errors[0]["message"], errors[0]
    ids = subprocess.run([worker(), "--issue-id", "nccl"], input="", capture_output=True, text=True,
                         timeout=60, env=env)
    assert ids.returncode == 1 and ids.stdout == "", ids.stdout + ids.stderr
    assert module in ids.stderr and why in ids.stderr, ids.stderr
    assert devices({"DDPD_CUDA_PLUGIN": module}) == "[]\n"  # no usable device: an empty array
