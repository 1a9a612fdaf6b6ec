"""test_ranks.py — ranks on several hosts (namespaced, scripts/hosts-up.sh): a 4-rank job as
2 hosts x 2 ranks (shared memory inside a host, TCP across) and as 4 hosts x 1 rank, with
the rendezvous root on the server's host reached through DDPD_COMM_ADDR (`--comm-addr`),
gives losses and final weights bitwise equal to the same job on one host, for a job with
join (uneven data) and grad_accum 2. The hosts' traffic counters show which links were TCP
(the host's veth) and which were shared memory (no gradient bytes on the host's loopback).
The same through `ddpd serve --comm-addr 10.77.0.254` and its API."""
import numpy as np
import pytest

import hostlib
from pylib import ddp as H
from pylib.safetensors import st_same_training

WORLD = 4
ROWS = (9, 5, 7, 3)  # uneven: join; batch 2 -> 5, 3, 4, 2 batches


def make_case(work):
    model = H.mlp(8, 96, 96, 4)
    x, y = H.make_xy(sum(ROWS), 8, 4, "cross_entropy", seed=20)
    cut = np.cumsum((0,) + ROWS)
    xs = [x[cut[r]:cut[r + 1]] for r in range(WORLD)]
    ys = [y[cut[r]:cut[r + 1]] for r in range(WORLD)]
    spec = {"name": "multihost", "device": "cpu", "model": model, "loss": "cross_entropy",
            "optimizer": {"type": "sgd", "lr": 0.1, "momentum": 0.9}, "batch_size": 2, "epochs": 2,
            "grad_accum": 2, "log_every": 1, "ddp": {"join": True, "timeout_s": 30}}
    case = H.Case.per_rank(spec, xs, ys, H.init_weights(model, 20))
    return case.write(work / "data")


def grad_bytes(spec):
    """Bytes of one rank's gradients (every linear layer's weight and bias, float32)."""
    return 4 * sum(m["in"] * m["out"] + m["out"] for m in spec["model"] if m["type"] == "linear")


def same_run(a, b):
    """Loss events (rank, step, value as printed) and model.safetensors byte for byte."""
    la = sorted(((e["rank"], e["step"], e["loss"]) for e in a.of("loss")), key=lambda t: t[:2])
    lb = sorted(((e["rank"], e["step"], e["loss"]) for e in b.of("loss")), key=lambda t: t[:2])
    assert la and la == lb, f"losses differ:\none host: {la}\nhosts:    {lb}"
    ja = sorted((e["rank"], e["step"]) for e in a.of("join"))
    jb = sorted((e["rank"], e["step"]) for e in b.of("join"))
    assert ja and ja == jb, f"join events differ: {ja} vs {jb}"
    ma = (a.out / "model.safetensors").read_bytes()
    mb = (b.out / "model.safetensors").read_bytes()
    assert ma == mb, "final weights differ from the one-host run's (bytes)"


@pytest.mark.parametrize("layout", [(1, 1, 2, 2), (1, 2, 3, 4)], ids=["2hosts_x_2ranks", "4hosts_x_1rank"])
def test_ranks_across_hosts_match_one_host_bitwise(hosts, work, layout):
    spec = make_case(work)
    ref = hostlib.run_job(spec, WORLD, work, "one-host").check_ok(WORLD)
    before = {h: hostlib.link_stats(h) for h in set(layout)}
    run = hostlib.run_job(spec, WORLD, work, "hosts", rank_hosts=layout).check_ok(WORLD)
    after = {h: hostlib.link_stats(h) for h in set(layout)}
    same_run(ref, run)

    # Where the bytes went: every step all-reduces the gradients (grad_accum 2: every
    # second micro-batch) over the ring, each rank sending about 2(W-1)/W of them to next.
    steps = max(int(e["step"]) for e in run.of("loss"))
    ring = grad_bytes(spec) * steps  # a low bound: more than the rendezvous and hellos
    for h in set(layout):
        eth_tx = after[h]["eth0"][1] - before[h]["eth0"][1]
        lo_tx = after[h]["lo"][1] - before[h]["lo"][1]
        assert eth_tx > ring, f"host {h} sent {eth_tx} bytes on its link, expected more than {ring} (TCP across hosts)"
        # Ranks on one host talk over shared memory: their loopback carries no gradients.
        assert lo_tx < ring / 4, f"host {h}'s loopback carried {lo_tx} bytes: a same-host link went over TCP"


def test_server_with_comm_addr_runs_ranks_on_hosts(hosts, work, make_server):
    # `ddpd serve --comm-addr 10.77.0.254` (the local launcher, its ranks placed on hosts 1
    # and 2 by the DDPD_WORKER): the job succeeds through the API with the one-host numbers.
    spec = make_case(work)
    ref = hostlib.run_job(spec, WORLD, work, "one-host").check_ok(WORLD)
    env = hostlib.env_on_hosts((1, 1, 2, 2))
    env.pop("DDPD_COMM_ADDR")  # the server's --comm-addr sets it for the issuer
    s = make_server(start=False, cpu_slots=WORLD, extra=["--comm-addr", hostlib.SERVER_ADDR], env=env)
    assert make_case(s.root) == spec  # the same files in the server's --data-dir (root/data)
    s.start()
    before = {h: hostlib.link_stats(h)["eth0"][1] for h in (1, 2)}
    job = s.submit(dict(spec, name="served"))
    j = s.wait_state(job["id"], ("succeeded", "failed", "cancelled"), timeout=180)
    assert j["state"] == "succeeded", j
    ring = grad_bytes(spec) * max(int(e["step"]) for e in ref.of("loss"))
    for h in (1, 2):
        sent = hostlib.link_stats(h)["eth0"][1] - before[h]
        assert sent > ring, f"host {h} sent {sent} bytes, expected more than {ring}: were the ranks there?"
    got = sorted((e["rank"], e["step"], e["loss"]) for e in s.events(job["id"]) if e["event"] == "loss")
    want = sorted((e["rank"], e["step"], e["loss"]) for e in ref.of("loss"))
    assert got == want, f"losses differ from one host's:\n{got[:6]}\n{want[:6]}"
    served = (s.jobs_dir / str(job["id"]) / "model.safetensors").read_bytes()
    # (the one-host run read other copies of the data files: only their mtimes differ)
    assert st_same_training(served, (ref.out / "model.safetensors").read_bytes()), \
        "final weights differ from one host's"
