"""A data file truncated under a running job (worker/mapguard.c): tokens files and .npy
files over 64 MiB are memory-mapped, and reading a page past the new end of a truncated
file raises SIGBUS. The rank must end with an `error` event of kind `data` naming the file
and exit code 2 (CONTRACT.md §6), and the job fail with that message, not with "killed by
signal 7" and no file named."""
import os
import re
import time

import numpy as np
import pytest

from pylib.server import FOREVER_STEPS, seed_spec

CHANGED = "the file changed while the job was running: it is now shorter than the {size} bytes"


def _tokens_job(data_dir):
    """A tiny GPT on a 1 MiB tokens file (always mapped): 32767 windows of 16 ids."""
    path = data_dir / "train.bin"
    np.random.default_rng(1).integers(0, 256, size=1 << 19, dtype=np.uint16).tofile(path)
    spec = seed_spec(model=[{"type": "embedding", "num": 256, "dim": 8},
                            {"type": "position", "max": 16, "dim": 8},
                            {"type": "linear", "in": 8, "out": 256}],
                     input_shape=[16], loss="cross_entropy", batch_size=4,
                     data={"type": "tokens", "path": "train.bin", "block_size": 16})
    return spec, path


def _npy_job(data_dir):
    """A linear model on an x.npy of 80 MB of float32 values (over the 64 MiB from which
    .npy files are mapped), sparse: it costs no disk. y is small, so it is loaded."""
    n = 2_000_000
    path = data_dir / "x.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (n, 10)})
        f.truncate(f.tell() + n * 10 * 4)
    np.save(data_dir / "y.npy", np.zeros((n, 1), dtype=np.float32))
    spec = seed_spec(model=[{"type": "linear", "in": 10, "out": 1}], batch_size=4,
                     data={"type": "npy", "x": "x.npy", "y": "y.npy"})
    return spec, path


@pytest.mark.parametrize("make_job,world", [(_tokens_job, 1), (_npy_job, 1), (_tokens_job, 2)],
                         ids=["tokens", "npy", "tokens-2-ranks"])
def test_data_file_truncated_under_a_running_job_fails_it_naming_the_file(server, curl_streams, make_job, world):
    spec, path = make_job(server.data_dir)
    size = path.stat().st_size
    # Shuffled windows from all over the file, one loss event per step, and more steps
    # than the test lasts: after the truncation the next batch or so reads past the end.
    spec.update(name="truncated", steps=FOREVER_STEPS, log_every=1, world_size=world)
    spec.pop("epochs")
    jid = server.submit(spec)["id"]
    st = curl_streams(f"{server.url}/v1/jobs/{jid}/events", fmt="ndjson",
                      headers=["Accept: application/x-ndjson"])
    st.until(lambda e: e["event"] == "loss", timeout=60)
    truncated_at, t0 = time.time(), time.monotonic()
    os.truncate(path, 4096)
    evs = st.rest(timeout=60)
    j = server.wait_state(jid, ("failed", "succeeded", "cancelled"), timeout=30)
    took = time.monotonic() - t0

    want = f"{path.name}: {CHANGED.format(size=size)}"
    assert j["state"] == "failed", j
    m = re.match(r"rank (\d+) failed \(exit code 2\): (.*)", j["error"] or "", re.S)
    assert m and m.group(2).startswith(want), j["error"]
    blamed = int(m.group(1))
    ranks = {r["rank"]: r for r in j["ranks"]}
    assert ranks[blamed]["exit_code"] == 2 and ranks[blamed]["state"] == "failed", ranks
    # Every rank that read past the end says so; a peer may see the death first (comm,
    # exit 3) or end on the launcher's SIGTERM (cancelled, 5): never a death by a signal.
    errs = [e for e in evs if e["event"] == "error"]
    data = [e for e in errs if e["kind"] == "data"]
    assert blamed in [e["rank"] for e in data], errs
    assert all(e["kind"] in ("data", "comm", "cancelled") for e in errs), errs
    assert all(r["exit_code"] in (2, 3, 5) for r in ranks.values()), ranks
    if world == 1:
        assert len(errs) == 1, errs
    for e in data:
        assert e["message"].startswith(want), e
        # The handler stamps the event when it runs, not when the file was mapped.
        assert e["ts"] >= truncated_at - 0.001, (e["ts"], truncated_at)
    assert evs[-1]["event"] == "state" and evs[-1]["state"] == "failed", evs[-1]
    # The rank's log says it too.
    log = server.get(f"/v1/jobs/{jid}/logs", params={"rank": blamed})
    assert log.status_code == 200 and f"[rank {blamed}] error (data): {want}" in log.text, log.text[-2000:]
    assert server.free_cpu_slots() == 2, server.devices()
    print(f"failed {took:.2f}s after the truncation, exit codes {[ranks[r]['exit_code'] for r in sorted(ranks)]}: "
          f"{j['error']}")
