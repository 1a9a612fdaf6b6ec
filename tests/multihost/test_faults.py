"""test_faults.py — faults on the wire between namespaced hosts (scripts/hosts-up.sh):
  - a link cut (`ip link set ... down`) in the middle of a large all-reduce: the job fails
    within ddp.timeout_s plus a few seconds, its error names the rank it lost, and no
    process is left on any host;
  - latency and loss (`tc netem`, skipped where the kernel lacks it), and a slow link
    whose queue overflows (`tc tbf`: real drops and retransmissions): the job completes
    with the same numbers as on one host;
  - a peer that accepts the TCP connection and never answers the handshake, posing as the
    rendezvous root or as a rank: the job fails within its deadline, naming it;
  - a rank whose host's monotonic clock is days ahead (a time namespace, skipped where the
    kernel has none): the job completes with the same numbers."""
import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

import hostlib
from pylib import ddp as H
from test_ranks import WORLD, make_case, same_run

TIMEOUT_S = 4  # ddp.timeout_s of the failing jobs
SLACK_S = 8  # worker start, process teardown and the launcher's grace on a busy 2-core machine


def start_job(spec, world, work, name, rank_hosts, env_extra=None):
    work = Path(work)
    spec_path = work / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    out = work / name
    cmd = H.ddpd_cmd(world, spec_path, out, work / "data")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=hostlib.env_on_hosts(rank_hosts, env_extra), cwd=str(work))
    return p, out, cmd


def wait_for_loss(p, timeout):
    """Reads p's stdout until the first loss event (bounded); returns the lines read."""
    lines, buf = [], ""
    deadline = time.monotonic() + timeout
    fd = p.stdout.fileno()
    while time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 0.2)
        if not r:
            continue
        chunk = os.read(fd, 65536).decode()
        if not chunk:
            break
        buf += chunk
        while "\n" in buf:
            ln, buf = buf.split("\n", 1)
            lines.append(ln)
            if '"event":"loss"' in ln.replace(" ", ""):
                return lines
    raise AssertionError(f"no loss event within {timeout} s: {lines[-5:]}")


def finish(p, timeout):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"the job did not end within {timeout} s\n{err[-2000:]}")
    return out, err


def errors_of(lines):
    evs = []
    for ln in lines:
        try:
            e = json.loads(ln)
        except ValueError:
            continue
        if isinstance(e, dict) and e.get("event") == "error":
            evs.append(e)
    return evs


def test_link_cut_mid_allreduce_fails_naming_the_lost_rank(hosts, work):
    # 2 hosts x 1 rank; a 5.3 M-parameter model: each step's all-reduce moves ~21 MB
    # across the link, so a cut after the first loss lands inside one.
    (work / "data").mkdir()
    spec = {"name": "cut", "world_size": 2, "device": "cpu", "model": H.mlp(256, 2048, 2048, 10),
            "loss": "mse", "optimizer": {"type": "sgd", "lr": 0.001},
            "data": {"type": "synthetic", "samples": 4000, "seed": 3}, "batch_size": 4, "epochs": 1,
            "log_every": 1, "ddp": {"timeout_s": TIMEOUT_S}}
    p, out, cmd = start_job(spec, 2, work, "cut", (1, 2))
    try:
        lines = wait_for_loss(p, 120)
        t_cut = time.monotonic()
        subprocess.run(["ip", "link", "set", "ddpd-v2", "down"], check=True, timeout=20)
        rest, err = finish(p, TIMEOUT_S + SLACK_S + 30)
        took = time.monotonic() - t_cut
    finally:
        subprocess.run(["ip", "link", "set", "ddpd-v2", "up"], timeout=20)
        if p.poll() is None:
            p.kill()
            p.wait()
    lines += rest.splitlines()
    logs = "".join((out / f"rank-{r}.log").read_text(errors="replace")[-800:] for r in range(2)
                   if (out / f"rank-{r}.log").exists())
    assert p.returncode != 0, f"the job succeeded through a cut link\n{err[-2000:]}"
    assert took <= TIMEOUT_S + SLACK_S, f"the job took {took:.1f} s to fail after the cut (timeout_s {TIMEOUT_S})"
    evs = errors_of(lines)
    assert evs, f"no error event\n{err[-2000:]}\n{logs}"
    comm = [e for e in evs if e.get("kind") == "comm"]
    assert comm, f"no comm error: {evs}"
    # Rank 0 lost rank 1 and rank 1 lost rank 0: each names the other.
    for e in comm:
        other = 1 - int(e["rank"])
        assert f"rank {other}" in e["message"], f"rank {e['rank']}'s error does not name rank {other}: {e}"
        assert "allreduce" in e["message"], f"the cut did not end an all-reduce: {e}"
    assert "rank" in err and ("failed" in err or "exit" in err), err[-2000:]
    print(f"cut: failed {took:.2f} s after the cut; {[e['message'] for e in comm]}")
    left = hostlib.wait_no_leftovers(hosts, timeout=20)
    assert not left, "processes left after the cut:\n" + "\n".join(left)


def netem(host, args):
    return subprocess.run(["tc", "-n", f"ddpd-h{host}", "qdisc", "replace", "dev", "eth0", "root", "netem", *args],
                          capture_output=True, text=True, timeout=20)


def test_netem_delay_and_loss_same_numbers(hosts, work):
    spec = make_case(work)
    ref = hostlib.run_job(spec, WORLD, work, "one-host").check_ok(WORLD)
    p = netem(1, ["delay", "3ms", "1ms", "loss", "2%"])
    try:
        if p.returncode != 0:
            pytest.skip(f"tc netem is not available here: {p.stderr.strip()}")
        q = netem(2, ["delay", "2ms", "reorder", "5%", "loss", "1%"])
        assert q.returncode == 0, q.stderr
        run = hostlib.run_job(spec, WORLD, work, "netem", rank_hosts=(1, 1, 2, 2), timeout=300).check_ok(WORLD)
        st = subprocess.run(["tc", "-n", "ddpd-h1", "-s", "qdisc", "show", "dev", "eth0"], capture_output=True,
                            text=True, timeout=20).stdout
    finally:
        for h in (1, 2):
            subprocess.run(["tc", "-n", f"ddpd-h{h}", "qdisc", "del", "dev", "eth0", "root"], capture_output=True,
                           timeout=20)
    same_run(ref, run)
    assert "netem" in st, st


def _silent_listener(host):
    """A listener on host HOST that accepts and never answers: (process, 'ip:port')."""
    code = ("import socket,sys\n"
            "s=socket.socket(); s.bind((sys.argv[1],0)); s.listen(16)\n"
            "print(s.getsockname()[1], flush=True)\n"
            "held=[]\n"
            "while True:\n    c,_=s.accept(); held.append(c)\n")
    p = hostlib.on_host(host, "/usr/bin/python3", "-c", code, hostlib.addr(host), stdout=subprocess.PIPE, text=True,
                        start_new_session=True)
    r, _, _ = select.select([p.stdout], [], [], 30)
    assert r, "the silent listener did not start"
    port = int(p.stdout.readline())
    return p, f"{hostlib.addr(host)}:{port}"


def _spec_small(name):
    return {"name": name, "world_size": 2, "device": "cpu", "model": H.mlp(4, 8, 2), "loss": "mse",
            "optimizer": {"type": "sgd", "lr": 0.01}, "data": {"type": "synthetic", "samples": 64, "seed": 4},
            "batch_size": 4, "epochs": 1, "log_every": 1, "ddp": {"timeout_s": TIMEOUT_S}}


def test_silent_root_fails_within_the_deadline_naming_it(hosts, work):
    (work / "data").mkdir()
    lst, where = _silent_listener(3)
    try:
        t0 = time.monotonic()
        p, out, cmd = start_job(_spec_small("silent-root"), 2, work, "silent-root", (1, 2),
                                {"DDPD_FAKE_ROOT": where})
        rest, err = finish(p, TIMEOUT_S + SLACK_S + 30)
        took = time.monotonic() - t0
    finally:
        os.killpg(lst.pid, signal.SIGKILL)  # nsenter and the listener in the host's PID namespace
        lst.wait()
    assert p.returncode != 0, err
    assert took <= TIMEOUT_S + SLACK_S, f"{took:.1f} s"
    evs = errors_of(rest.splitlines())
    assert evs and all(e["kind"] == "comm" for e in evs), evs
    for e in evs:
        assert where in e["message"] and "timed out" in e["message"], e
    print(f"silent root: failed after {took:.2f} s; {evs[0]['message']}")


def test_silent_rank_fails_within_the_deadline_naming_it(hosts, work):
    # Rank 1 is a fake on host 3: it registers with the root, accepts rank 0's ring
    # connection and never answers the hello.
    (work / "data").mkdir()
    t0 = time.monotonic()
    p, out, cmd = start_job(_spec_small("silent-rank"), 2, work, "silent-rank", ("1", "f3"))
    rest, err = finish(p, TIMEOUT_S + SLACK_S + 30)
    took = time.monotonic() - t0
    assert p.returncode != 0, err
    assert took <= TIMEOUT_S + SLACK_S, f"{took:.1f} s"
    evs = [e for e in errors_of(rest.splitlines()) if e.get("rank") == 0]
    assert evs and evs[0]["kind"] == "comm", (evs, err[-2000:])
    assert "rank 1" in evs[0]["message"], evs[0]
    print(f"silent rank: failed after {took:.2f} s; {evs[0]['message']}")
    assert "rank 0" in err or "rank 1" in err, err[-2000:]


def test_offset_monotonic_clock_on_one_host(hosts, work):
    if not Path("/proc/self/ns/time").exists():
        pytest.skip("this kernel has no time namespaces")
    probe = subprocess.run(["unshare", "--fork", "--time", "--monotonic=864000", "/usr/bin/python3", "-c",
                            "import time; print(time.monotonic())"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"unshare --time fails here: {probe.stderr.strip()}")
    assert float(probe.stdout) - time.monotonic() > 800000, "the time namespace's offset is not seen"
    spec = make_case(work)
    ref = hostlib.run_job(spec, WORLD, work, "one-host").check_ok(WORLD)
    run = hostlib.run_job(spec, WORLD, work, "time", rank_hosts=("1", "1", "2t", "2t")).check_ok(WORLD)
    same_run(ref, run)


def test_slow_link_that_drops_packets_same_numbers(hosts, work):
    # Where netem is missing, tbf still shapes: a 20 Mbit/s link whose queue holds 6 KB
    # drops what overflows (the ring's bursts do), so TCP retransmits under the job.
    spec = make_case(work)
    ref = hostlib.run_job(spec, WORLD, work, "one-host").check_ok(WORLD)
    qd = ["tbf", "rate", "20mbit", "burst", "6kb", "limit", "6kb"]
    p = subprocess.run(["tc", "-n", "ddpd-h1", "qdisc", "replace", "dev", "eth0", "root", *qd], capture_output=True,
                       text=True, timeout=20)
    try:
        if p.returncode != 0:
            pytest.skip(f"tc tbf is not available here: {p.stderr.strip()}")
        q = subprocess.run(["tc", "-n", "ddpd-h2", "qdisc", "replace", "dev", "eth0", "root", *qd],
                           capture_output=True, text=True, timeout=20)
        assert q.returncode == 0, q.stderr
        run = hostlib.run_job(spec, WORLD, work, "tbf", rank_hosts=(1, 1, 2, 2), timeout=300).check_ok(WORLD)
        stats = [json.loads(subprocess.run(["tc", "-n", f"ddpd-h{h}", "-s", "-j", "qdisc", "show", "dev", "eth0"],
                                           capture_output=True, text=True, timeout=20).stdout)[0] for h in (1, 2)]
    finally:
        for h in (1, 2):
            subprocess.run(["tc", "-n", f"ddpd-h{h}", "qdisc", "del", "dev", "eth0", "root"], capture_output=True,
                           timeout=20)
    same_run(ref, run)
    drops = sum(s.get("drops", 0) for s in stats)
    assert drops > 0, f"the shaped links dropped nothing: {stats}"
    print(f"tbf: {drops} packets dropped, same numbers")
