"""test_slurm_nodes.py — `ddpd serve --launcher slurm` on a two-node Slurm: slurmctld beside
the server in the root namespace, one slurmd per namespaced host (slurm-hosts.sh), the
rendezvous root on the server's host through `--comm-addr 10.77.0.254`, one rank per node
(`--slurm-arg --ntasks-per-node=1`). A job is submitted, streamed and succeeds with the
same numbers as on one host, its ranks on both nodes; a cancel ends it everywhere; a node
whose every process is killed mid-job, and a node cut off the network mid-job, fail the
job within bounded time (rank 0 names the rank it lost; the job's error is Slurm's node
failure, naming the node), and leave nothing on any host. Skipped (77) where
slurmd cannot run in the namespaces."""
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import hostlib
from pylib import ddp as H
from pylib import server as api
from pylib.common import make_workdir

HERE = Path(__file__).resolve().parent
FINAL = ("succeeded", "failed", "cancelled")
TIMEOUT_S = 5


@pytest.fixture(scope="module")
def slurm2(_hosts_session, request):
    for p in ("slurmctld", "slurmd", "srun", "munged"):
        if not (Path("/usr/sbin", p).exists() or Path("/usr/bin", p).exists()):
            pytest.skip(f"{p} is not installed (scripts/install-deps.sh: slurm-wlm, munge)")
    if not Path("/etc/munge/munge.key").exists():
        pytest.skip("/etc/munge/munge.key is missing")
    d = make_workdir("ddpd-slurm-hosts-")
    try:
        p = subprocess.run([str(HERE / "slurm-hosts.sh"), "up", str(d), "2"], capture_output=True, text=True,
                           timeout=180)
    except subprocess.TimeoutExpired:
        subprocess.run([str(HERE / "slurm-hosts.sh"), "down", str(d)], capture_output=True, timeout=120)
        raise
    if p.returncode != 0:
        subprocess.run([str(HERE / "slurm-hosts.sh"), "down", str(d)], capture_output=True, timeout=120)
        pytest.skip(f"slurmd cannot run in the namespaced hosts here: {p.stderr.strip()[-1500:]}")
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(d / "slurm.conf")
    yield d
    subprocess.run([str(HERE / "slurm-hosts.sh"), "down", str(d)], capture_output=True, timeout=120)
    if request.session.testsfailed == 0 and os.environ.get("DDPD_KEEP_TMP") != "1":
        shutil.rmtree(d, ignore_errors=True)  # kept after a failure: the daemons' logs
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


def sinfo_state(node):
    p = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%t"], capture_output=True, text=True, timeout=20)
    return p.stdout.strip()


def node_back(d, i):
    """slurmd on host I runs again and its node is idle (bounded inside the script)."""
    p = subprocess.run([str(HERE / "slurm-hosts.sh"), "slurmd", str(d), str(i)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr


def server2(make_server):
    return make_server(extra=["--launcher", "slurm", "--comm-addr", hostlib.SERVER_ADDR,
                              "--slurm-arg", "--ntasks-per-node=1"])


def spec2(name, steps, log_every=1, model=None):
    return api.seed_spec(name=name, world_size=2, epochs=None, steps=steps, batch_size=8,
                         model=model or H.mlp(10, 64, 5), log_every=log_every,
                         data={"type": "synthetic", "samples": 512, "seed": 7},
                         ddp={"timeout_s": TIMEOUT_S})


def launched_on(d, node):
    """How many job steps slurmd on NODE launched (its log)."""
    f = d / "log" / f"slurmd-{node}.log"
    return len(re.findall(r"launch task StepId=", f.read_text(errors="replace"))) if f.exists() else 0


def test_two_node_job_streams_and_matches_one_host(hosts, slurm2, make_server, work):
    s = server2(make_server)
    spec = spec2("nodes", steps=30)
    before = {n: launched_on(slurm2, n) for n in ("h1", "h2")}
    job = s.submit(spec)
    stream = api.CurlStream(f"{s.url}/v1/jobs/{job['id']}/events", max_time=180)
    got = []
    while True:
        ev = stream.next(timeout=120)
        if ev is None:
            break
        got.append(ev)
    j = s.wait_state(job["id"], FINAL, timeout=60)
    assert j["state"] == "succeeded", (j, (s.jobs_dir / str(job["id"]) / "srun.log").read_text()[-2000:])
    assert [e["state"] for e in got if e["event"] == "state"][-1] == "succeeded", got[-3:]
    losses = sorted((e["rank"], e["step"], e["loss"]) for e in got if e["event"] == "loss")
    assert {r for r, _, _ in losses} == {0, 1}, losses
    for n in ("h1", "h2"):
        assert launched_on(slurm2, n) > before[n], f"slurmd on {n} launched no task of the job"
    # The same job on one host (ddpd run, local launcher): the same losses, bit for bit.
    (work / "data").mkdir(exist_ok=True)
    ref = hostlib.run_job(dict(spec, name="nodes"), 2, work, "one-host").check_ok(2)
    want = sorted((e["rank"], e["step"], e["loss"]) for e in ref.of("loss"))
    assert losses == want, f"losses differ from one host's:\n{losses[:6]}\n{want[:6]}"


def wait_losses(s, jid, n=2, timeout=120):
    api.wait_until(lambda: (lambda rs: len(rs) == n and all(r.get("step") for r in rs))(s.job(jid)["ranks"]),
                   timeout, "a loss from every rank")


def test_cancel_ends_the_job_on_both_nodes(hosts, slurm2, make_server):
    s = server2(make_server)
    job = s.submit(spec2("nodes-cancel", steps=api.FOREVER_STEPS, log_every=200))
    s.wait_state(job["id"], "running", timeout=60)
    wait_losses(s, job["id"])
    t0 = time.monotonic()
    r = s.post(f"/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 202, r.text
    j = s.wait_state(job["id"], FINAL, timeout=60)
    assert j["state"] == "cancelled", j
    assert time.monotonic() - t0 < 30
    left = hostlib.wait_no_leftovers(2, timeout=30)
    assert not left, left


def _failing_job(s, name):
    # A model big enough that its all-reduce is in flight most of the time.
    job = s.submit(spec2(name, steps=api.FOREVER_STEPS, log_every=1, model=H.mlp(256, 1024, 1024, 10)))
    try:
        s.wait_state(job["id"], "running", timeout=60)
    except AssertionError as e:
        q = subprocess.run(["squeue"], capture_output=True, text=True, timeout=20).stdout
        raise AssertionError(f"{e}\nsqueue:\n{q}\nsinfo: h1 {sinfo_state('h1')}, h2 {sinfo_state('h2')}") from None
    wait_losses(s, job["id"])
    return job


SLURMD_TIMEOUT_S = 10  # slurm-hosts.sh: how long slurmctld waits before it calls a node dead


def check_lost_node(s, job, j, took, what):
    """Host 2 (rank 1's node) was lost: rank 0 fails on its own deadline naming rank 1;
    srun cannot end the step on the lost node, so the job ends when Slurm declares the
    node failed, and its error says so, naming the node."""
    assert j["state"] == "failed", j
    assert "h2" in (j["error"] or ""), j
    errs = [e for e in s.events(job["id"]) if e["event"] == "error" and e.get("rank") == 0]
    assert errs and errs[0]["kind"] == "comm" and "rank 1" in errs[0]["message"], errs
    assert took <= TIMEOUT_S + SLURMD_TIMEOUT_S + 30, f"{what}: the job took {took:.1f} s to fail"
    print(f"{what}: failed after {took:.1f} s: {j['error']}; rank 0: {errs[0]['message']}")


def test_node_killed_mid_job_fails_it_naming_a_rank(hosts, slurm2, make_server):
    s = server2(make_server)
    job = _failing_job(s, "nodes-kill")
    inits = set(hostlib.host_inits().values())
    t0 = time.monotonic()
    try:
        # Every process of host 2 (slurmd, slurmstepd, the rank): as if the machine died.
        for pid in hostlib.pids_on("ddpd-h2"):
            if pid not in inits and Path(f"/proc/{pid}/comm").exists() and \
                    Path(f"/proc/{pid}/comm").read_text().strip() != "unshare":
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
        j = s.wait_state(job["id"], FINAL, timeout=TIMEOUT_S + 60)
        took = time.monotonic() - t0
    finally:
        node_back(slurm2, 2)
    check_lost_node(s, job, j, took, "node killed")
    left = hostlib.wait_no_leftovers(2, timeout=30)
    assert not left, left


def test_node_unreachable_mid_job_fails_it_naming_a_rank(hosts, slurm2, make_server):
    s = server2(make_server)
    job = _failing_job(s, "nodes-cut")
    t0 = time.monotonic()
    subprocess.run(["ip", "link", "set", "ddpd-v2", "down"], check=True, timeout=20)
    try:
        j = s.wait_state(job["id"], FINAL, timeout=TIMEOUT_S + 90)
        took = time.monotonic() - t0
    finally:
        subprocess.run(["ip", "link", "set", "ddpd-v2", "up"], timeout=20)
    check_lost_node(s, job, j, took, "node unreachable")
    # Host 2's rank gives up on its own deadline; slurmstepd there ends once it can talk again.
    left = hostlib.wait_no_leftovers(2, timeout=60)
    node_back(slurm2, 2)
    assert not left, left
