"""test_resume.py — resuming a multi-rank job gives exactly the numbers of the uninterrupted
run (README "Running a job", issue 15 item 12), for every optimizer the spec allows, with
join (uneven ranks: sharded data whose shards differ by a sample, and `{rank}` files where
rank 0 runs out first), with grad_accum, and for each data kind (synthetic, npy, csv).

Ranks that join early step their optimizer less often (DDP.md §4.5: a joined rank's
optimizer does not step), so their momentum buffers, Adam moments and step counts differ
from rank 0's. Each case runs the job straight, then again from each of its checkpoints,
and asserts: every rank's losses after the checkpoint are bitwise those of the straight
run, and the final model.safetensors and every rank's optimizer file are bitwise equal.
Also: a checkpoint records world_size and a resume with another world size is refused
naming it; checkpoint files are 0600 and their folders 0700.
"""
import json
import os
import stat
import struct
from pathlib import Path

import numpy as np
import pytest

from pylib import ddp as H
from pylib.parity import write_csv


@pytest.fixture(autouse=True)
def _skip_code(request):
    H.install_skip_code(request.config)


@pytest.fixture
def work(tmp_path):
    return H.workdir("resume-") if H.os.environ.get("DDPD_TEST_TMP") else tmp_path


MODEL = H.mlp(4, 8, 3, act="tanh")

OPTIMIZERS = {
    "sgd_momentum": {"type": "sgd", "lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 1e-3},
    "sgd_nesterov": {"type": "sgd", "lr": 0.05, "momentum": 0.8, "nesterov": True},
    "adamw": {"type": "adamw", "lr": 0.01, "weight_decay": 0.05},
}

# layout: (W, per-rank sample counts or None for sharded, total samples, batch, grad_accum,
# epochs, every_steps)
LAYOUTS = {
    # 3 ranks over 25 samples: shards 9, 8, 8 -> 5, 4, 4 batches of 2; ranks 1 and 2 join
    # for the last step of every epoch (steps 5, 10, 15); checkpoints at 4, 8, 12
    "sharded": (3, None, 25, 2, 1, 3, 4),
    # {rank} files of 5, 14 and 9 rows -> 3, 7, 5 batches: rank 0 runs out first (so the
    # weights of a checkpoint taken while it shadows come from another rank); 2 epochs of
    # 7 steps, checkpoints at 3, 6 (ranks 0 and 2 shadowing) and 9, 12
    "rank": (3, [5, 14, 9], None, 2, 1, 2, 3),
    # the same files in steps of 3 micro-batches: 1, 3 and 2 steps per epoch
    "rank_accum": (3, [5, 14, 9], None, 2, 3, 3, 2),
}

CASES = [(o, lay, d) for o in sorted(OPTIMIZERS)
         for lay, d in [("sharded", "synthetic"), ("sharded", "npy"), ("sharded", "csv"),
                        ("rank", "npy"), ("rank", "csv"), ("rank_accum", "npy"), ("rank_accum", "csv")]]
# The data readers and their resume positions are host code: on the emulated GPU the npy
# cases run every optimizer and layout, the other kinds only on the CPU.
HOST_DATA = pytest.mark.cpu_only("synthetic and CSV data are read on the host: the npy case of this optimizer "
                                 "and layout runs the same steps on the device")


def write_job(work, optimizer, layout, kind):
    """The data files and the spec of one case."""
    world, sizes, total, bs, k, epochs, every = LAYOUTS[layout]
    data = Path(work) / "data"
    data.mkdir(parents=True, exist_ok=True)
    n = total if total else sum(sizes)
    x, y = H.make_xy(n, 4, 3, "mse", seed=41)
    spec = {"name": "resume", "device": "cpu", "model": MODEL, "loss": "mse", "optimizer": optimizer,
            "batch_size": bs, "epochs": epochs, "grad_accum": k, "log_every": 1, "world_size": world,
            "checkpoint": {"every_steps": every, "keep_last": 1000}, "init": {"seed": 3}}
    if kind == "synthetic":
        spec["data"] = {"type": "synthetic", "samples": n, "seed": 5}
    elif sizes is None:
        if kind == "npy":
            np.save(data / "x.npy", x)
            np.save(data / "y.npy", y)
            spec["data"] = {"type": "npy", "x": "x.npy", "y": "y.npy", "seed": 5}
        else:
            write_csv(data / "d.csv", x, y, ["t0", "t1", "t2"], "mse")
            spec["data"] = {"type": "csv", "path": "d.csv", "target": ["t0", "t1", "t2"], "seed": 5}
    else:
        lo = 0
        for r, m in enumerate(sizes):
            if kind == "npy":
                np.save(data / f"x_{r}.npy", x[lo:lo + m])
                np.save(data / f"y_{r}.npy", y[lo:lo + m])
            else:
                write_csv(data / f"d_{r}.csv", x[lo:lo + m], y[lo:lo + m], ["t0", "t1", "t2"], "mse")
            lo += m
        if kind == "npy":
            spec["data"] = {"type": "npy", "x": "x_{rank}.npy", "y": "y_{rank}.npy", "seed": 5}
        else:
            spec["data"] = {"type": "csv", "path": "d_{rank}.csv", "target": ["t0", "t1", "t2"], "seed": 5}
    return spec, world


def raw_tensors(path):
    """{name: raw bytes} and the metadata of a safetensors file."""
    buf = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", buf[:8])
    hdr = json.loads(buf[8:8 + n])
    meta = hdr.pop("__metadata__", {})
    body = buf[8 + n:]
    return {k: body[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in hdr.items()}, meta


def bitwise_diff(a, b):
    """None when the two files hold the same tensors bit for bit, else what differs."""
    ta, _ = raw_tensors(a)
    tb, _ = raw_tensors(b)
    if sorted(ta) != sorted(tb):
        return f"{b}: tensors {sorted(tb)} vs {sorted(ta)}"
    for k in sorted(ta):
        if ta[k] != tb[k]:
            va, vb = np.frombuffer(ta[k], "<f4"), np.frombuffer(tb[k], "<f4")
            return (f"{b.name} {k}: {int((va != vb).sum())}/{va.size} elements differ, max "
                    f"{np.abs(va.astype(np.float64) - vb).max():.3g}")
    return None


def state_files(world, replicas=False):
    """The files of a checkpoint with per-rank state (join on)."""
    return (["model.safetensors", "optim.safetensors"] + [f"optim-rank-{r}.safetensors" for r in range(1, world)]
            + ([f"model-rank-{r}.safetensors" for r in range(1, world)] if replicas else []))


@pytest.mark.parametrize("opt,layout,kind", [pytest.param(o, l, d, marks=[HOST_DATA] if d != "npy" else [])
                                             for o, l, d in CASES], ids=[f"{o}-{l}-{d}" for o, l, d in CASES])
def test_resume_is_exact(work, opt, layout, kind):
    H.need_bin()
    spec, world = write_job(work, OPTIMIZERS[opt], layout, kind)
    check_resumes(work, spec, world)


def test_resume_with_a_step_budget_is_exact(work):
    # `steps` instead of epochs: 11 steps of 7 per epoch end inside the second epoch, while
    # ranks 0 and 2 shadow rank 1 (their {rank} files hold fewer batches)
    H.need_bin()
    spec, world = write_job(work, OPTIMIZERS["adamw"], "rank", "npy")
    del spec["epochs"]
    spec["steps"] = 11
    check_resumes(work, spec, world)


def check_resumes(work, spec, world):
    """Runs the job straight, then from each of its checkpoints, and compares."""
    full = H.run_ddpd(spec, world, work, name="full").check_ok(world)
    want = full.losses()
    total = full.of("done", rank=0)[0]["steps"]
    ckpts = sorted(int(p.name.split("-")[1]) for p in full.out.glob("ckpt-*"))
    every = spec["checkpoint"]["every_steps"]
    assert ckpts == list(range(every, total, every)), f"checkpoints {ckpts} of {total} steps"
    for c in ckpts:
        d = full.out / f"ckpt-{c}"
        res = H.run_ddpd(spec, world, work, name=f"from-{c}", extra=["--resume", str(d)]).check_ok(world)
        got = res.losses()
        for r in range(world):
            later = {s: v for s, v in want.get(r, {}).items() if s > c}
            mine = got.get(r, {})
            assert sorted(mine) == sorted(later), f"rank {r} logged steps {sorted(mine)} after ckpt-{c}"
            diff = [(s, mine[s], later[s]) for s in sorted(later) if mine[s] != later[s]]
            assert not diff, f"resumed from ckpt-{c}: rank {r}'s losses differ (step, resumed, straight): {diff}"
        msg = bitwise_diff(full.out / "model.safetensors", res.out / "model.safetensors")
        assert msg is None, f"resumed from ckpt-{c}: {msg}"

        names = sorted(p.name for p in d.iterdir())
        # each rank's replica is there unless the checkpoint ends an epoch (then the join's
        # final sync makes them equal)
        replicas = raw_tensors(d / "model.safetensors")[1].get("replicas") == "true"
        assert names == sorted(state_files(world, replicas)), f"{d}: {names}"
        for f in names:
            _, meta = raw_tensors(d / f)
            assert meta.get("world_size") == str(world) and meta.get("step") == str(c), (f, meta)
        for f in state_files(world):
            msg = bitwise_diff(full.out / f, res.out / f)
            assert msg is None, f"resumed from ckpt-{c}: {msg}"
        for later_c in (x for x in ckpts if x > c):
            for f in sorted(p.name for p in (full.out / f"ckpt-{later_c}").iterdir()):
                msg = bitwise_diff(full.out / f"ckpt-{later_c}" / f, res.out / f"ckpt-{later_c}" / f)
                assert msg is None, f"resumed from ckpt-{c}, its ckpt-{later_c}: {msg}"

    # the ranks really held different optimizer state (else the case would test nothing)
    assert any(bitwise_diff(full.out / f"ckpt-{c}" / "optim.safetensors",
                            full.out / f"ckpt-{c}" / f"optim-rank-{r}.safetensors")
               for c in ckpts for r in range(1, world)), "every rank's optimizer state is rank 0's"


def test_resume_continues_the_schedule_clipping_and_eval(work):
    # CONTRACT.md §2a: the lr schedule runs on the global step, so a resumed job continues
    # it (warmup and cosine across the checkpoints); clipping and eval carry on too. Every
    # number after the checkpoint is bitwise the straight run's: losses, lr, grad_norm,
    # eval events, the weights and the optimizer state.
    H.need_bin()
    spec, world = write_job(work, OPTIMIZERS["sgd_momentum"], "rank", "npy")
    spec["optimizer"] = dict(spec["optimizer"], schedule={"type": "cosine", "warmup_steps": 4, "min_lr": 0.001})
    spec["grad_clip"] = 0.05
    spec["eval"] = {"data": {"type": "npy", "x": "x_1.npy", "y": "y_1.npy"}, "every_steps": 5}
    check_resumes(work, spec, world)
    full = H.run_ddpd(spec, world, work, name="full-events").check_ok(world)
    res = H.run_ddpd(spec, world, work, name="from-6-events",
                     extra=["--resume", str(Path(work) / "full" / "ckpt-6")]).check_ok(world)
    assert any(e["grad_norm"] > 0.05 for e in full.of("loss")), "no step clipped"
    pick = lambda run: sorted((e["event"], e["rank"], e["step"], e.get("lr"), e.get("grad_norm"), e.get("loss"),
                               e.get("samples")) for e in run.events if e.get("event") in ("loss", "eval")
                              and e["step"] > 6)
    assert pick(res) == pick(full)
    assert [e["step"] for e in full.of("eval")] == [5, 10, 14], full.of("eval")


@pytest.mark.cpu_only("the world size of a checkpoint is checked on the host before training")
def test_resume_with_another_world_size_is_refused(work):
    H.need_bin()
    spec, world = write_job(work, OPTIMIZERS["adamw"], "sharded", "synthetic")
    full = H.run_ddpd(spec, world, work, name="full").check_ok(world)
    for other in (2, 4):
        s = dict(spec, world_size=other)
        res = H.run_ddpd(s, other, work, name=f"w{other}", extra=["--resume", str(full.out / "ckpt-4")])
        assert res.rc == 2, res.describe()
        errs = res.of("error")
        assert errs and all("world_size" in e["message"] and f"written by {world} ranks" in e["message"]
                            and f"got {other}" in e["message"] for e in errs), errs
    # the final files resume too (nothing left to do but the count of ranks must match)
    res = H.run_ddpd(dict(spec, world_size=1), 1, work, name="w1", extra=["--resume", str(full.out)])
    assert res.rc == 2 and "world_size" in res.of("error")[0]["message"], res.describe()


@pytest.mark.cpu_only("file modes are the host's writes, whatever the device")
def test_checkpoint_files_are_private(work):
    H.need_bin()
    spec, world = write_job(work, OPTIMIZERS["sgd_momentum"], "rank", "npy")
    old = os.umask(0o022)  # the usual umask: without care, files come out 0644
    try:
        full = H.run_ddpd(spec, world, work, name="full").check_ok(world)
    finally:
        os.umask(old)
    found = 0
    for root, dirs, files in os.walk(full.out):
        for d in dirs:
            mode = stat.S_IMODE(os.stat(os.path.join(root, d)).st_mode)
            assert mode == 0o700, f"{os.path.join(root, d)} is {oct(mode)}"
        for f in files:
            if f.endswith(".safetensors"):
                found += 1
                mode = stat.S_IMODE(os.stat(os.path.join(root, f)).st_mode)
                assert mode == 0o600, f"{os.path.join(root, f)} is {oct(mode)}"
    assert found >= 3 * 4, found


@pytest.mark.cpu_only("a checkpoint folder's files are checked on the host before training")
def test_mixed_or_missing_rank_files_are_refused(work):
    """A checkpoint folder whose per-rank files do not belong to it (copied from another
    checkpoint) or are missing is refused, naming the file, instead of resuming a mixture."""
    import shutil
    H.need_bin()
    spec, world = write_job(work, OPTIMIZERS["sgd_momentum"], "sharded", "npy")
    full = H.run_ddpd(spec, world, work, name="full").check_ok(world)
    bad = full.out / "ckpt-8"
    shutil.copy(full.out / "ckpt-4" / "optim-rank-1.safetensors", bad / "optim-rank-1.safetensors")
    res = H.run_ddpd(spec, world, work, name="mixed", extra=["--resume", str(bad)])
    assert res.rc == 2, res.describe()
    msgs = [e["message"] for e in res.of("error", rank=1)]
    assert msgs and "optim-rank-1.safetensors" in msgs[0] and "not rank 1's state of step 8" in msgs[0], msgs

    bad = full.out / "ckpt-12"
    (bad / "optim-rank-2.safetensors").unlink()
    res = H.run_ddpd(spec, world, work, name="missing", extra=["--resume", str(bad)])
    assert res.rc == 2, res.describe()
    msgs = [e["message"] for e in res.of("error", rank=2)]
    assert msgs and "optim-rank-2.safetensors" in msgs[0], msgs


@pytest.mark.cpu_only("the data files are fingerprinted and checked on the host before training")
def test_resume_on_changed_data_is_refused_naming_the_file(work):
    """Each checkpoint records the fingerprints of the data files (issue 28 item 5): a
    `ddpd run --resume` on a file that every rank reads and that changed since is refused
    before any rank starts (the planner), a rank's own {rank} file by that rank as it loads
    the checkpoint; both name the file and what changed, exit 2. --force goes on, saying
    what changed; a file copied back unchanged resumes, as exactly as ever."""
    H.need_bin()
    data = Path(work) / "data"
    spec, world = write_job(work, OPTIMIZERS["sgd_momentum"], "sharded", "npy")
    full = H.run_ddpd(spec, world, work, name="full").check_ok(world)
    meta = raw_tensors(full.out / "ckpt-8" / "optim.safetensors")[1]
    files = json.loads(meta["data_fingerprints"])["files"]
    assert [(f["field"], f["file"], f["samples"], "rank" in f) for f in files] == \
        [("data.x", "x.npy", 25, False), ("data.y", "y.npy", 25, False)], files
    kept = {c: (data / f"{c}.npy").read_bytes() for c in "xy"}
    for c in "xy":
        np.save(data / f"{c}.npy", np.load(data / f"{c}.npy")[:24])
    res = H.run_ddpd(spec, world, work, name="shorter", extra=["--resume", str(full.out / "ckpt-8")])
    assert res.rc == 2, res.describe()
    want = (f'data.x "x.npy" changed since the checkpoint at step 8: size {len(kept["x"])} → '
            f'{(data / "x.npy").stat().st_size} bytes, rows 25 → 24 (and 1 more data file changed); to train on '
            "the data as it is now, resume with force")
    assert [e["message"] for e in res.of("error")] == [want], res.describe()
    assert not res.of("start") and not (res.out / "rank-0.log").exists(), "a rank started"
    for c in "xy":  # the same bytes written again: the same data
        (data / f"{c}.npy").write_bytes(kept[c])
    res = H.run_ddpd(spec, world, work, name="same", extra=["--resume", str(full.out / "ckpt-8")]).check_ok(world)
    assert "was modified or renamed since the checkpoint at step 8" in res.log(0), res.log(0)
    assert bitwise_diff(full.out / "model.safetensors", res.out / "model.safetensors") is None

    # {rank} files: rank 1's own file, its rows in another order (the same size).
    spec, world = write_job(work, OPTIMIZERS["sgd_momentum"], "rank", "npy")
    full = H.run_ddpd(spec, world, work, name="full-rank").check_ok(world)
    files = json.loads(raw_tensors(full.out / "ckpt-6" / "model.safetensors")[1]["data_fingerprints"])["files"]
    assert sorted((f["file"], f.get("rank"), f["samples"]) for f in files) == sorted(
        (f"{c}_{r}.npy", r, n) for c in "xy" for r, n in enumerate([5, 14, 9])), files
    np.save(data / "x_1.npy", np.load(data / "x_1.npy")[::-1])
    res = H.run_ddpd(spec, world, work, name="rank-changed", extra=["--resume", str(full.out / "ckpt-6")])
    assert res.rc != 0, res.describe()
    msgs = [e["message"] for e in res.of("error", rank=1)]
    assert msgs and msgs[0].startswith(
        'data.x "x_1.npy" (rank 1\'s file) changed since the checkpoint at step 6: same size ('), res.describe()
    assert not [e for e in res.of("error") if e["rank"] != 1 and e["kind"] == "data"], res.describe()
    res = H.run_ddpd(spec, world, work, name="rank-forced",
                     extra=["--resume", str(full.out / "ckpt-6"), "--force"]).check_ok(world)
    assert 'warning: data.x "x_1.npy" (rank 1\'s file) changed since the checkpoint at step 6' in res.log(1)
    assert "(force)" in res.log(1) and "changed since" not in res.log(0), (res.log(0), res.log(1))
    bad = H.run_ddpd(spec, world, work, name="force-alone", extra=["--force"])
    assert bad.rc == 2 and "--force goes with --resume" in bad.stderr, bad.describe()


@pytest.mark.cpu_only("checkpoint retention is the host's file work, whatever the device")
def test_a_resume_prunes_what_a_rank_killed_before_its_prune_left(work):
    """A rank killed between a checkpoint's commit and its prune leaves keep_last + 1
    checkpoints (and perhaps a torn ckpt-N.tmp). The restart resumes from the newest and
    prunes the rest at once, so a job cancelled before its next checkpoint still keeps
    keep_last (seen in CI as api.test_retention's three checkpoints of keep_last 2)."""
    import shutil
    H.need_bin()
    spec, world = write_job(work, OPTIMIZERS["adamw"], "sharded", "synthetic")
    spec["checkpoint"]["keep_last"] = 2
    full = H.run_ddpd(spec, world, work, name="full").check_ok(world)
    kept = sorted(int(d.name[5:]) for d in full.out.glob("ckpt-*"))
    assert len(kept) == 2, kept
    # The kill's leftovers: an older checkpoint the prune never reached, a torn one.
    shutil.copytree(full.out / f"ckpt-{kept[0]}", full.out / "ckpt-1")
    (full.out / "ckpt-2.tmp").mkdir()
    res = H.run_ddpd(spec, world, work, name="full", extra=["--resume", str(full.out / f"ckpt-{kept[1]}")])
    res.check_ok(world)
    after = [d.name for d in full.out.iterdir() if d.name.startswith("ckpt-")]
    assert sorted(after) == sorted([f"ckpt-{kept[0]}", f"ckpt-{kept[1]}"]), after
