"""GPUs and the CUDA module, through the real server, on any machine: a rank's
CUDA_VISIBLE_DEVICES is the device of its scheduler slot (`--gpus 2,3` puts slot 0 on GPU
2, not GPU 0), and a CPU job's worker never maps CUDA, cuBLAS or NCCL (they live in
libddpd-cuda.so, which only a CUDA job or an NCCL group loads)."""
import json
import re
import sys

from pylib.server import FOREVER_STEPS, heavy_spec, seed_spec, wait_until

CUDA_LIBS = re.compile(r"lib(cuda|cudart|cublas|cublasLt|nccl|ddpd-cuda)[.-]")


def fake_worker(path, real, record_dir):
    """A ddpd-worker stand-in: as a rank it records its CUDA_VISIBLE_DEVICES, waits (at
    most 10 s) until every rank has, then runs the real worker on the same document;
    anything else (the id issuer) is the real one. The wait matters where the real worker
    fails at once (a build without CUDA): the first rank's failure makes the launcher stop
    the others, which may not have recorded yet."""
    path.write_text(f"""#!{sys.executable}
import json, os, subprocess, sys, time
REAL = {str(real)!r}
RECORD = {str(record_dir)!r}
if len(sys.argv) > 1:
    os.execv(REAL, [REAL] + sys.argv[1:])
doc = sys.stdin.buffer.read()
d = json.loads(doc)
rank, world = d["rank"], d["world_size"]
tmp = os.path.join(RECORD, f".rank-{{rank}}.tmp")
with open(tmp, "w") as f:
    json.dump({{"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}}, f)
os.rename(tmp, os.path.join(RECORD, f"rank-{{rank}}.json"))
deadline = time.monotonic() + 10
while time.monotonic() < deadline and not all(
        os.path.exists(os.path.join(RECORD, f"rank-{{r}}.json")) for r in range(world)):
    time.sleep(0.01)
sys.exit(subprocess.run([REAL], input=doc).returncode)
""")
    path.chmod(0o755)


def test_rank_gets_the_gpu_of_its_slot(make_server, work):
    record = work / "ranks"
    record.mkdir()
    fake = work / "fake-worker"
    srv = make_server(start=False, cpu_slots=1, extra=["--gpus", "2,3"])
    fake_worker(fake, srv.bin / "ddpd-worker", record)
    srv.env = {"DDPD_WORKER": str(fake)}
    srv.start()
    gpus = srv.devices()["gpus"]
    assert [g["index"] for g in gpus] == [0, 1], gpus
    assert [g["device"] for g in gpus] == ["2", "3"], gpus
    spec = seed_spec(name="gpus", device="cuda", world_size=2, ddp={"backend": "cpu"})
    jid = srv.submit(spec)["id"]
    # There is no GPU 2 or 3 here (nor, on most machines, a GPU): the ranks start, say
    # which device they were given, and the job fails with the device error.
    srv.wait_state(jid, ("failed", "succeeded"), timeout=120)
    seen = {r: json.loads((record / f"rank-{r}.json").read_text())["cuda_visible_devices"]
            for r in (0, 1)}
    assert seen == {0: "2", 1: "3"}, seen


def test_bad_gpu_list_is_refused(make_server):
    srv = make_server(start=False, extra=["--gpus", "1,1"])
    try:
        srv.start(timeout=10)
    except AssertionError as e:
        assert "GPU 1 is listed twice" in str(e) or "GPU 1 is listed twice" in srv.stderr()
    else:
        raise AssertionError("ddpd serve --gpus 1,1 started")
    assert srv.proc.wait(timeout=10) == 2


def test_cpu_job_worker_maps_no_cuda(server):
    jid = server.submit(heavy_spec(world_size=1, steps=FOREVER_STEPS, log_every=10))["id"]
    try:
        job = server.wait_running(jid, timeout=60)
        pid = job["ranks"][0]["pid"]
        # Past its start: the model is built and steps are running.
        wait_until(lambda: server.job(jid).get("step", 0) or None, 60, "a first step")
        maps = open(f"/proc/{pid}/maps").read()
        assert "libopenblas" in maps, "not the worker's map"  # the check reads the right process
        mapped = sorted({m.group(0) for m in CUDA_LIBS.finditer(maps)})
        assert not mapped, f"a CPU job's worker mapped {mapped}"
    finally:
        server.post(f"/v1/jobs/{jid}/cancel")
        server.wait_state(jid, ("cancelled", "failed", "succeeded"), timeout=30)
