"""test_emulated_gpus.py — the GPU path of `ddpd serve` on a machine without a GPU, through
the emulated CUDA module: `DDPD_CUDA_PLUGIN=$DDPD_BIN/libddpd-cuda-emu.so` with
`DDPD_CUDA_EMU=2` gives the server two small emulated devices, which `--gpus auto` finds
(`ddpd-worker --devices`), the scheduler's GPU slots hold, each rank sees through its own
`CUDA_VISIBLE_DEVICES`, and the ranks of a job join over (emulated) NCCL with the id the
server's issuer made. Everything else is the real server, talked to over HTTP on
127.0.0.1: `/v1/devices` says the GPUs are emulated; a world-2 NCCL job streams both ranks'
losses to `done`; a cancel ends such a job cancelled; a rank killed with SIGKILL fails the
job at once, not after the collective timeout; a job that asks for more GPUs than there
are is refused saying how many there are; two 1-GPU jobs run at the same time, one per
device; an explicit `--gpus` list is described from `--devices` and pins its ranks; a GPU
whose compute capability (DDPD_CUDA_EMU_CC) the module holds no code for
(DDPD_CUDA_EMU_CODE) is shown so and given to no job, and a job that would need it is
refused at submit (422 at `device`) naming the GPU, its capability and the module's code.
Skipped (77) where the build has no libddpd-cuda-emu.so.

The emulated device runs every CUDA thread as a fiber on the CPU: the models here are a
few hundred parameters and the finite jobs a dozen steps. Jobs that must still be running
when the test acts train for FOREVER_STEPS and are cancelled or killed."""
import os
import signal

import pytest

from pylib.server import FOREVER_STEPS, bin_dir, final_state_events, seed_spec, wait_until

EMU_GPUS = 2
FINAL = ("succeeded", "failed", "cancelled")
# Generous for a loaded 2-core machine: the emulator is slow, and a start loads a module.
JOB_S = 300
COMM_TIMEOUT_S = 120  # the killed-rank test's collective timeout: the failure must not wait for it


def emu_module():
    b = bin_dir()
    if b is None:
        pytest.skip("ddpd is not built (set DDPD_BIN to the build folder)")
    m = b / "libddpd-cuda-emu.so"
    if not m.is_file():
        pytest.skip(f"no emulated CUDA module in {b} (libddpd-cuda-emu.so)")
    return m


def emu_env(n=EMU_GPUS):
    # The server's own CUDA_VISIBLE_DEVICES is set, so that one in the test's environment
    # cannot hide a device: slot i is then device "i".
    return {"DDPD_CUDA_PLUGIN": str(emu_module()), "DDPD_CUDA_EMU": str(n),
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(n))}


@pytest.fixture
def gpu_server(make_server):
    """A server with the two emulated GPUs (--gpus auto) and one CPU slot."""
    env = emu_env()
    return make_server(cpu_slots=1, extra=["--gpus", "auto"], env=env)


def cuda_spec(name, world_size, steps, **over):
    """A tiny MLP (178 parameters) on synthetic data, on the GPUs, ranks joined by NCCL."""
    s = seed_spec(name=name, device="cuda", world_size=world_size, epochs=None, steps=steps,
                  model=[{"type": "linear", "in": 8, "out": 16}, {"type": "relu"},
                         {"type": "linear", "in": 16, "out": 2}],
                  data={"type": "synthetic", "samples": 64, "seed": 1}, batch_size=4, log_every=1,
                  ddp={"backend": "nccl", "timeout_s": COMM_TIMEOUT_S})
    s.update(over)
    return s


def rank_log(srv, jid, rank):
    p = srv.jobs_dir / str(jid) / f"rank-{rank}.log"
    return p.read_text(errors="replace") if p.exists() else ""


def gpu_line(srv, jid, rank):
    """The device line of a rank's log ("on GPU 0 of 1 visible (ddpd emulated GPU 1), ..."),
    once it is there."""
    def line():
        return next((ln for ln in rank_log(srv, jid, rank).splitlines() if " visible (" in ln), None)
    return wait_until(line, 60, f"job {jid} rank {rank}'s device line in its log")


def wait_stepping(srv, jid):
    """Waits until every rank of the job runs and the job has a first loss: it is training."""
    srv.wait_running(jid, timeout=JOB_S)
    return wait_until(lambda: (lambda j: j if j.get("step") else None)(srv.job(jid)), JOB_S,
                      f"job {jid}'s first loss")


def test_devices_lists_the_emulated_gpus(gpu_server):
    gpus = gpu_server.devices()["gpus"]
    assert len(gpus) == EMU_GPUS, gpus
    for i, g in enumerate(gpus):
        assert g["index"] == i and g["device"] == str(i) and g["job"] is None, g
        assert g["emulated"] is True, g
        assert g["name"] == f"ddpd emulated GPU {i}", g
        assert isinstance(g["memory"], int) and g["memory"] > 0, g
        assert g["uuid"].startswith("GPU-"), g
        assert (g["compute_capability"], g["has_code"], g["code"]) == ("9.0", True, "sm_90"), g
    assert gpus[0]["uuid"] != gpus[1]["uuid"], gpus
    assert "2 GPUs" in gpu_server.stderr(), gpu_server.stderr()[-2000:]


def test_world_2_nccl_job_streams_both_ranks_losses(gpu_server, curl_streams):
    steps = 12
    jid = gpu_server.submit(cuda_spec("emu-ddp", 2, steps))["id"]
    stream = curl_streams(f"{gpu_server.url}/v1/jobs/{jid}/events?format=ndjson", fmt="ndjson",
                          max_time=JOB_S + 60)
    evs = stream.until(lambda e: e.get("event") == "state" and e.get("state") in FINAL, timeout=JOB_S)
    job = gpu_server.job(jid)
    assert job["state"] == "succeeded", (job["error"], rank_log(gpu_server, jid, 0)[-1500:],
                                         rank_log(gpu_server, jid, 1)[-1500:])
    starts = [e for e in evs if e["event"] == "start"]
    assert sorted(e["rank"] for e in starts) == [0, 1] and all(e["device"] == "cuda" for e in starts), starts
    for r in (0, 1):
        losses = [e for e in evs if e["event"] == "loss" and e["rank"] == r]
        assert [e["step"] for e in losses] == list(range(1, steps + 1)), (r, losses[-3:])
        assert all(isinstance(e["loss"], float) for e in losses), losses
        assert [e["steps"] for e in evs if e["event"] == "done" and e["rank"] == r] == [steps], r
    # One emulated GPU per rank, each the device of its slot.
    for r in (0, 1):
        assert f"on GPU 0 of 1 visible (ddpd emulated GPU {r})" in gpu_line(gpu_server, jid, r)
    assert (gpu_server.jobs_dir / str(jid) / "model.safetensors").exists()
    assert all(g["job"] is None for g in gpu_server.devices()["gpus"])


def test_cancel_a_running_cuda_job(gpu_server):
    jid = gpu_server.submit(cuda_spec("emu-cancel", 2, FOREVER_STEPS))["id"]
    wait_stepping(gpu_server, jid)
    assert {g["job"] for g in gpu_server.devices()["gpus"]} == {jid}
    r = gpu_server.post(f"/v1/jobs/{jid}/cancel")
    assert r.status_code == 202, r.text
    job = gpu_server.wait_state(jid, FINAL, timeout=60)
    assert job["state"] == "cancelled", job
    assert all(g["job"] is None for g in gpu_server.devices()["gpus"])


def test_a_killed_rank_fails_the_job_without_waiting_for_the_collective_timeout(gpu_server):
    jid = gpu_server.submit(cuda_spec("emu-kill", 2, FOREVER_STEPS))["id"]
    job = wait_stepping(gpu_server, jid)
    assert job["spec"]["ddp"]["timeout_s"] == COMM_TIMEOUT_S
    pid = next(rk["pid"] for rk in job["ranks"] if rk["rank"] == 1)
    os.kill(pid, signal.SIGKILL)
    # Half the collective timeout at most: a failure that waited for it cannot pass.
    job = gpu_server.wait_state(jid, FINAL, timeout=COMM_TIMEOUT_S / 2)
    assert job["state"] == "failed", job
    assert job["error"].startswith("rank 1 failed") and "signal 9" in job["error"], job["error"]
    evs = gpu_server.events(jid)
    assert [e["state"] for e in final_state_events(evs)] == ["failed"], final_state_events(evs)
    # Rank 0 was waiting for rank 1 in an all-reduce: what ended it is the NCCL error that
    # names the lost rank (or the launcher's SIGTERM, when that came first), never its
    # collective timeout.
    for e in evs:
        if e["event"] == "error":
            assert e["rank"] == 0 and e["kind"] in ("comm", "cancelled"), e
            assert "not done within" not in e["message"], e
    assert all(g["job"] is None for g in gpu_server.devices()["gpus"])


def test_more_gpus_than_there_are_is_refused(gpu_server):
    r = gpu_server.post("/v1/jobs", json=cuda_spec("emu-too-big", 3, 4))
    assert r.status_code == 422, r.text
    e = r.json()["error"]
    assert e["path"] == "world_size", e
    assert e["message"] == "world_size 3 needs 3 GPUs but this server has 2", e
    assert gpu_server.get("/v1/jobs").json()["jobs"] == []


def test_two_one_gpu_jobs_run_side_by_side(gpu_server):
    a = gpu_server.submit(cuda_spec("emu-a", 1, FOREVER_STEPS))["id"]
    b = gpu_server.submit(cuda_spec("emu-b", 1, FOREVER_STEPS))["id"]
    try:
        for jid in (a, b):
            wait_stepping(gpu_server, jid)
        held = {g["device"]: g["job"] for g in gpu_server.devices()["gpus"]}
        assert sorted(held.values()) == [a, b], held
        lines = {jid: gpu_line(gpu_server, jid, 0) for jid in (a, b)}
        for jid in (a, b):
            dev = next(d for d, j in held.items() if j == jid)
            assert f"on GPU 0 of 1 visible (ddpd emulated GPU {dev})" in lines[jid], (jid, held, lines)
    finally:
        for jid in (a, b):
            gpu_server.post(f"/v1/jobs/{jid}/cancel")
        for jid in (a, b):
            assert gpu_server.wait_state(jid, FINAL, timeout=60)["state"] == "cancelled"
    # They overlapped: each was running before the other ended.
    span = {}
    for jid in (a, b):
        evs = gpu_server.events(jid)
        running = [e["ts"] for e in evs if e["event"] == "state" and e["state"] == "running"]
        end = [e["ts"] for e in final_state_events(evs)]
        assert running and end, evs[-5:]
        span[jid] = (running[0], end[-1])
    assert span[a][0] < span[b][1] and span[b][0] < span[a][1], span


def test_an_explicit_gpu_list_is_described_and_pinned(make_server):
    # --gpus 1,5: slot 0 is emulated GPU 1, described from --devices; slot 1 names a device
    # this host has not, so nothing is known of it (and a job there would fail to open it).
    srv = make_server(cpu_slots=1, extra=["--gpus", "1,5"], env=emu_env())
    g0, g1 = srv.devices()["gpus"]
    assert (g0["device"], g0["name"], g0["emulated"]) == ("1", "ddpd emulated GPU 1", True), g0
    assert (g1["device"], g1["name"], g1["memory"], g1["uuid"], g1["emulated"]) == ("5", None, None, None, False), g1
    jid = srv.submit(cuda_spec("emu-slot", 1, 3))["id"]
    assert srv.wait_state(jid, FINAL, timeout=JOB_S)["state"] == "succeeded", rank_log(srv, jid, 0)[-1500:]
    assert "on GPU 0 of 1 visible (ddpd emulated GPU 1)" in gpu_line(srv, jid, 0)


def test_a_gpu_without_code_is_shown_and_a_job_that_needs_it_is_refused(make_server):
    """GPU 0 a 9.0, GPU 1 a V100 (7.0), the module built for sm_80 and sm_90 (no PTX): GPU 1
    is listed with has_code false and never given to a job. A world-2 job would need it:
    422 at `device`, before a job exists (it would fail at its first kernel on GPU 1); a
    world-1 job runs on GPU 0. 422, not 409: like a world_size larger than the server's
    GPUs, the request can never succeed on this server as built, whatever else runs."""
    env = emu_env()
    env.update(DDPD_CUDA_EMU_CC="9.0,7.0", DDPD_CUDA_EMU_CODE="sm_80 sm_90")
    srv = make_server(cpu_slots=1, extra=["--gpus", "auto"], env=env)
    g0, g1 = srv.devices()["gpus"]
    assert (g0["compute_capability"], g0["has_code"], g0["code"]) == ("9.0", True, "sm_90"), g0
    assert (g1["compute_capability"], g1["has_code"], g1["code"]) == ("7.0", False, None), g1
    assert "GPU 1 (ddpd emulated GPU 1) has compute capability 7.0" in srv.stderr(), srv.stderr()[-2000:]
    r = srv.post("/v1/jobs", json=cuda_spec("emu-nocode", 2, 4))
    assert r.status_code == 422, r.text
    e = r.json()["error"]
    assert e["path"] == "device", e
    for want in ("GPU 1 (device 1, ddpd emulated GPU 1) has compute capability 7.0",
                 "it was built for sm_80 sm_90", "a job can use 1 of the 2 GPUs, world_size 2 needs 2",
                 "-DDDPD_CUDA_ARCHS=all"):
        assert want in e["message"], e
    assert srv.get("/v1/jobs").json()["jobs"] == []
    jid = srv.submit(cuda_spec("emu-on-gpu-0", 1, 3))["id"]
    assert srv.wait_state(jid, FINAL, timeout=JOB_S)["state"] == "succeeded", rank_log(srv, jid, 0)[-1500:]
    assert "on GPU 0 of 1 visible (ddpd emulated GPU 0)" in gpu_line(srv, jid, 0)


def test_a_server_whose_gpus_all_lack_code_refuses_cuda_jobs(make_server):
    # The build before issue 34 (sm_90 only) on an A100: every cuda job is refused.
    env = emu_env(1)
    env.update(DDPD_CUDA_EMU_CC="8.0", DDPD_CUDA_EMU_CODE="sm_90")
    srv = make_server(cpu_slots=1, extra=["--gpus", "auto"], env=env)
    r = srv.post("/v1/jobs", json=cuda_spec("emu-a100", 1, 4))
    assert r.status_code == 422, r.text
    e = r.json()["error"]
    assert e["path"] == "device" and "compute capability 8.0" in e["message"], e
    assert "built for sm_90" in e["message"], e
