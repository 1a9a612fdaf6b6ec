"""test_emulated_gpu_cli.py — the worker's and `ddpd run`'s GPU paths on the emulated CUDA
module (libddpd-cuda-emu.so beside ddpd-worker, selected with DDPD_CUDA_PLUGIN; DDPD_CUDA_EMU=N
devices): `ddpd-worker --devices` lists the N devices, named and flagged as emulated, with
their compute capability (DDPD_CUDA_EMU_CC) and whether the module's code (DDPD_CUDA_EMU_CODE)
runs there, and `[]` without DDPD_CUDA_EMU; CUDA_VISIBLE_DEVICES hides and renumbers them as
it does GPUs; a `ddpd run` on a device the module has no code for fails before its first
step saying so;
`--issue-id nccl` issues an id; and `ddpd run --device cuda --world-size 2` trains a tiny
model with one device per rank and NCCL between them, both variables reaching the ranks
and the id issuer through ddpd's environment allow-list. Skipped (77) where the build has
no libddpd-cuda-emu.so."""
import json
import os
import re
import subprocess

import pytest

from pylib import parity as h


@pytest.fixture(autouse=True)
def _skip_code(request):
    h.install_skip_code(request.config)


@pytest.fixture
def work(request, tmp_path, _skip_code):
    yield from h.workdir(request, tmp_path, "e2e-emu-")


def emu_module():
    m = h.ddpd_path().parent / "libddpd-cuda-emu.so"
    if not m.is_file():
        pytest.skip(f"no emulated CUDA module in {m.parent} (libddpd-cuda-emu.so)")
    return m


def emu_env(n=2, visible=None):
    """os.environ with the emulated module, n devices and CUDA_VISIBLE_DEVICES = `visible`
    (unset when None), as a dict for subprocess."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "DDPD_CUDA_EMU")}
    env["DDPD_CUDA_PLUGIN"] = str(emu_module())
    if n is not None:
        env["DDPD_CUDA_EMU"] = str(n)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return env


def devices(env):
    worker = h.ddpd_path().parent / "ddpd-worker"
    p = subprocess.run([str(worker), "--devices"], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 1, f"--devices should print one JSON array line: {p.stdout!r} {p.stderr}"
    return json.loads(lines[0])


UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def test_devices_lists_the_emulated_devices():
    devs = devices(emu_env(2))
    assert [d["index"] for d in devs] == [0, 1], devs
    for i, d in enumerate(devs):
        assert d["name"] == f"ddpd emulated GPU {i}", d
        assert d["emulated"] is True, d
        assert isinstance(d["memory"], int) and d["memory"] > 0, d
        assert UUID.fullmatch(d["uuid"]), d
    assert devs[0]["uuid"] != devs[1]["uuid"]
    # Without DDPD_CUDA_EMU the emulated module has no device: an empty array, not nothing.
    assert devices(emu_env(None)) == []


def test_devices_report_compute_capability_and_code():
    # The defaults: compute capability 9.0, and the release's code list, which runs there.
    d = devices(emu_env(1))[0]
    assert (d["compute_capability"], d["has_code"], d["code"]) == ("9.0", True, "sm_90"), d
    assert d["module_code"].split()[-1].startswith("compute_") and "sm_90" in d["module_code"].split(), d
    # An A10 (8.6) runs sm_80's cubin; a V100 (7.0) nothing of "sm_80 compute_90"; a
    # B200 (10.0) the PTX; CUDA_VISIBLE_DEVICES keeps each device's own capability.
    env = emu_env(3)
    env.update(DDPD_CUDA_EMU_CC="8.6,7.0,10.0", DDPD_CUDA_EMU_CODE="sm_80 compute_90")
    devs = devices(env)
    got = [(d["compute_capability"], d["has_code"], d["code"], d["module_code"]) for d in devs]
    assert got == [("8.6", True, "sm_80", "sm_80 compute_90"), ("7.0", False, None, "sm_80 compute_90"),
                   ("10.0", True, "compute_90", "sm_80 compute_90")], devs
    env["CUDA_VISIBLE_DEVICES"] = "1"
    d = devices(env)[0]
    assert (d["name"], d["compute_capability"], d["has_code"]) == ("ddpd emulated GPU 1", "7.0", False), d


def test_ddpd_run_on_a_gpu_without_code_fails_saying_why(work):
    """The module built for sm_90 alone (the build before issue 34) on an L40S (8.9): the
    rank refuses the device when it opens it, naming its capability and the module's code,
    instead of failing at its first kernel with cudaErrorNoKernelImageForDevice."""
    env = emu_env(1)
    env.update(DDPD_CUDA_EMU_CC="8.9", DDPD_CUDA_EMU_CODE="sm_90")
    r = h.run_ddpd(tiny_spec("emu-nocode", 4), work, work / "out", timeout=600,
                   extra_args=["--device", "cuda"], env=env)
    assert r.rc == 4, r.stderr[-2000:]
    errs = [e for e in r.events if e["event"] == "error"]
    assert errs and errs[0]["kind"] == "device", r.events[-3:]
    msg = errs[0]["message"]
    for want in ("compute capability 8.9", "built for sm_90", "DDPD_CUDA_ARCHS"):
        assert want in msg, msg
    assert not [e for e in r.events if e["event"] == "loss"], r.events


def test_cuda_visible_devices_hides_and_renumbers_them():
    all_devs = devices(emu_env(2))
    devs = devices(emu_env(2, visible="1"))
    assert len(devs) == 1 and devs[0]["index"] == 0, devs
    assert devs[0]["name"] == "ddpd emulated GPU 1" and devs[0]["uuid"] == all_devs[1]["uuid"], devs
    assert devices(emu_env(2, visible="")) == []


def test_issue_id_nccl():
    worker = h.ddpd_path().parent / "ddpd-worker"
    p = subprocess.run([str(worker), "--issue-id", "nccl"], input="", capture_output=True, text=True, timeout=60,
                       env=emu_env(2))
    assert p.returncode == 0, p.stderr
    assert re.fullmatch(r"[0-9a-f]{256}", json.loads(p.stdout.splitlines()[0])["id"]), p.stdout


def tiny_spec(name, steps):
    return {"name": name, "device": "cuda", "world_size": 2,
            "model": [{"type": "linear", "in": 8, "out": 16}, {"type": "relu"}, {"type": "linear", "in": 16, "out": 2}],
            "loss": "mse", "optimizer": {"type": "sgd", "lr": 0.05},
            "data": {"type": "synthetic", "samples": 64, "seed": 1}, "batch_size": 4,
            "steps": steps, "log_every": 1, "ddp": {"backend": "nccl", "timeout_s": 120}}


def test_ddpd_run_trains_on_two_emulated_devices(work):
    steps = 10
    r = h.run_ddpd(tiny_spec("emu-run", steps), work, work / "out", timeout=600,
                   extra_args=["--device", "cuda", "--world-size", "2"], env=emu_env(2))
    logs = {rk: (work / "out" / f"rank-{rk}.log").read_text(errors="replace") for rk in (0, 1)
            if (work / "out" / f"rank-{rk}.log").exists()}
    assert r.rc == 0, (r.stderr[-3000:], {k: v[-1500:] for k, v in logs.items()})
    evs = r.events
    starts = [e for e in evs if e["event"] == "start"]
    assert sorted(e["rank"] for e in starts) == [0, 1] and all(e["device"] == "cuda" for e in starts), starts
    for rk in (0, 1):
        assert [e["step"] for e in evs if e["event"] == "loss" and e["rank"] == rk] == list(range(1, steps + 1))
        assert [e["steps"] for e in evs if e["event"] == "done" and e["rank"] == rk] == [steps]
        # ddpd run gives no rank its own CUDA_VISIBLE_DEVICES: each sees both devices and
        # takes device rank % 2, so the two ranks are on different devices.
        assert f"on GPU {rk} of 2 visible (ddpd emulated GPU {rk})" in logs[rk], logs[rk][-1500:]
    assert (work / "out" / "model.safetensors").exists()


def test_ddpd_run_device_cuda_means_nccl_one_gpu_per_rank(work):
    """`--device cuda` on a spec that names no ddp.backend trains over NCCL (the backend a
    cuda spec gets), so three ranks on two GPUs are refused as NCCL refuses them, where the
    host-staged backend would have let two ranks share a GPU."""
    r = h.run_ddpd(tiny_spec("emu-dup", 4), work, work / "out", timeout=600,
                   extra_args=["--device", "cuda", "--world-size", "3"], env=emu_env(2))
    assert r.rc != 0, r.stderr[-2000:]
    assert "Duplicate GPU detected" in r.stderr, r.stderr[-2000:]
    assert "NCCL takes one GPU per rank" in r.stderr, r.stderr[-2000:]
