"""hostlib.py — the multi-host tests' helpers: bringing the namespaced hosts of
scripts/hosts-up.sh up and down (with a check that nothing is left on any of them), running
a command on a host, a job's ranks placed on hosts (`ddpd run` with rank_on_host.py as its
worker), and each host's traffic counters.

Hosts: ddpd-hI at 10.77.0.I/24 on the bridge ddpd-br0, whose address 10.77.0.254 is the
server's host (the root namespace): the rendezvous root listens there (DDPD_COMM_ADDR)."""
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from pylib.common import REPO
from pylib import ddp as H

SERVER_ADDR = "10.77.0.254"
SCRIPTS = REPO / "scripts"
WRAPPER = Path(__file__).resolve().parent / "rank_on_host.py"
MARK = "DDPD_TEST_MARK=multihost"  # in the environment of every process these tests start


def addr(i):
    return f"10.77.0.{i}"


def why_no_namespaces():
    """None when this machine can make network namespaces, else why not."""
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_NET_ADMIN"
    for p in ("ip", "unshare", "nsenter"):
        if shutil.which(p) is None and not Path("/usr/sbin", p).exists():
            return f"{p} is not installed"
    try:
        p = subprocess.run(["ip", "netns", "add", "ddpd-probe"], capture_output=True, text=True, timeout=20)
        if p.returncode != 0:
            return f"ip netns add fails: {p.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", "ddpd-probe"], capture_output=True, timeout=20)
    return None


def up(n):
    p = subprocess.run([str(SCRIPTS / "hosts-up.sh"), str(n)], capture_output=True, text=True, timeout=120)
    return None if p.returncode == 0 else f"hosts-up.sh {n} failed: {p.stderr.strip()}"


def pids_on(ns):
    p = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=20)
    return [int(x) for x in p.stdout.split()]


def host_inits():
    d = Path(os.environ.get("DDPD_HOSTS_DIR", "/run/ddpd-hosts"))
    out = {}
    for f in sorted(d.glob("h*.pid")):
        try:
            out[f.stem] = int(f.read_text().strip())
        except ValueError:
            pass
    return out


def leftovers(n):
    """Processes on hosts 1..n other than the host inits (and their unshare parents) and
    slurmd, and any process anywhere that carries MARK (the id issuer, a wrapper)."""
    inits = set(host_inits().values())
    left = []
    for i in range(1, n + 1):
        for pid in pids_on(f"ddpd-h{i}"):
            if pid in inits:
                continue
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if comm in ("unshare",) and "ddpd-host-init" in cmd:
                continue
            if comm == "slurmd":  # a host's Slurm agent (slurm-hosts.sh) stays between tests
                continue
            left.append((pid, f"host {i}: pid {pid} {cmd.strip()}"))
    # Anywhere (the server's host too: the id issuer, a wrapper): the tests' mark.
    seen = {pid for pid, _ in left}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in seen or int(d.name) == os.getpid():
            continue
        try:
            if MARK.encode() not in (d / "environ").read_bytes().split(b"\0"):
                continue
            if (d / "stat").read_text().split(") ")[-1][:1] == "Z":
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        left.append((int(d.name), f"pid {d.name} (marked) {cmd.strip()}"))
    return left


def wait_no_leftovers(n, timeout=20.0):
    """Bounded wait until no process but the host inits is on any host; returns what was
    left (and kills it, so that one test's leftovers do not fail the next)."""
    deadline = time.monotonic() + timeout
    left = leftovers(n)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = leftovers(n)
    for pid, _ in left:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    return [what for _, what in left]


def down():
    p = subprocess.run([str(SCRIPTS / "hosts-down.sh")], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stderr


def on_host(i, *cmd, **kw):
    """subprocess.Popen of CMD on host I."""
    return subprocess.Popen([str(SCRIPTS / "hosts-run.sh"), str(i), *map(str, cmd)], **kw)


def link_stats(i):
    """{'lo': (rx, tx), 'eth0': (rx, tx)} bytes on host I."""
    out = {}
    for dev in ("lo", "eth0"):
        p = subprocess.run(["ip", "-n", f"ddpd-h{i}", "-s", "-j", "link", "show", dev], capture_output=True,
                           text=True, timeout=20)
        st = json.loads(p.stdout)[0]["stats64"]
        out[dev] = (st["rx"]["bytes"], st["tx"]["bytes"])
    return out


def env_on_hosts(rank_hosts, extra=None):
    """The environment of a `ddpd run` (or `ddpd serve`) whose ranks run on the hosts given
    per rank, with the rendezvous root on this (the server's) host."""
    env = H.env1()
    env.update(DDPD_TEST_MARK="multihost", DDPD_WORKER=str(WRAPPER), DDPD_REAL_WORKER=str(H.need_bin() / "ddpd-worker"),
               DDPD_RANK_HOSTS=",".join(str(h) for h in rank_hosts), DDPD_REPO=str(REPO),
               DDPD_COMM_ADDR=SERVER_ADDR)
    if extra:
        env.update(extra)
    return env


def run_job(spec, world, work, name, rank_hosts=None, timeout=180, env_extra=None):
    """`ddpd run` of SPEC in WORK (data in WORK/data) with its ranks on hosts rank_hosts
    (None: all on this host, the plain launcher). Returns pylib.ddp.Run."""
    work = Path(work)
    spec_path = work / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    out = work / name
    cmd = H.ddpd_cmd(world, spec_path, out, work / "data")
    env = env_on_hosts(rank_hosts, env_extra) if rank_hosts else H.env1()
    if not rank_hosts and env_extra:
        env.update(env_extra)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(work))
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"ddpd run timed out after {timeout}s: {' '.join(cmd)}\n"
                             f"stdout: {(e.stdout or b'')[-2000:]!r}\nstderr: {(e.stderr or b'')[-2000:]!r}")
    return H.Run(p.returncode, p.stdout, p.stderr, out, cmd)
