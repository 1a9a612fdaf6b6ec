"""test_checkpoint.py — ddpd's safetensors checkpoints (CONTRACT.md §4) against PyTorch:
the final model.safetensors loads into nn.Sequential with a strict load_state_dict and
computes what PyTorch's own training computed; checkpoints every 5 steps; resuming from
ckpt-10 gives exactly the losses and bitwise the weights of the uninterrupted run; no
temporary files are left behind."""
import os

import numpy as np
import pytest

from pylib.parity import (Reference, compare_losses, compare_tensors, init_weights, make_xy, run_ddpd, st_load,
                      torch_mod, write_case)

MODEL = [{"type": "linear", "in": 8, "out": 16}, {"type": "gelu"},
         {"type": "linear", "in": 16, "out": 12}, {"type": "tanh"},
         {"type": "linear", "in": 12, "out": 3}]


def spec_of(optimizer, **kw):
    s = {"name": "ckpt", "device": "cpu", "model": MODEL, "loss": "cross_entropy", "optimizer": optimizer,
         "batch_size": 5, "log_every": 1}
    s.update(kw)
    return s


def leftovers(out):
    """Files under OUT that look like temporaries (a write that was not renamed into
    place), and files inside ckpt-* folders other than the two safetensors files."""
    bad = []
    for root, dirs, files in os.walk(out):
        for f in files + dirs:
            low = f.lower()
            if (low.startswith(".") or "tmp" in low or "temp" in low or low.endswith("~") or ".part" in low
                    or low.endswith(".partial") or low.endswith(".new")):
                bad.append(os.path.relpath(os.path.join(root, f), out))
        if os.path.basename(root).startswith("ckpt-"):
            extra = set(files) - {"model.safetensors", "optim.safetensors"}
            bad += [os.path.relpath(os.path.join(root, f), out) for f in sorted(extra)]
    return bad


def test_model_loads_in_pytorch(work):
    torch = torch_mod()
    x, y = make_xy(90, 8, 3, "cross_entropy", seed=21)
    spec = spec_of({"type": "adamw", "lr": 3e-3, "weight_decay": 0.02}, epochs=2)
    init_sd = init_weights(MODEL, 21)
    spec, data = write_case(work, spec, x, y, init_sd)
    ref = Reference(spec, data, init_sd)
    run = run_ddpd(spec, data, work / "out").check_ok()

    # the file itself: strict safetensors layout, F32, exactly the state_dict's keys
    tensors, _ = st_load(run.out / "model.safetensors", strict=True)
    assert sorted(tensors) == sorted(ref.model.state_dict().keys())
    for k, v in tensors.items():
        assert v.dtype == np.float32, f"{k} is {v.dtype}, want F32"
        assert tuple(v.shape) == tuple(ref.model.state_dict()[k].shape), k

    # strict load into a fresh nn.Sequential; its outputs equal the PyTorch-trained model's
    from pylib.parity import build_model
    m = build_model(MODEL)
    m.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=True)
    probe = torch.from_numpy(np.random.default_rng(22).standard_normal((64, 8)).astype(np.float32))
    with torch.no_grad():
        got = m(probe).numpy()
        want = ref.model(probe).numpy()
    msg = compare_tensors({"out": got}, {"out": want}, what="outputs of the loaded model")
    assert msg is None, msg

    ostate, meta = st_load(run.out / "optim.safetensors", strict=True)
    assert meta.get("step") == str(ref.steps), meta
    names = {k for k in ref.model.state_dict()}
    assert sorted(ostate) == sorted(f"{n}.{s}" for n in names for s in ("exp_avg", "exp_avg_sq"))
    assert not leftovers(run.out), leftovers(run.out)


def bitwise_diff(pa, pb):
    """None when the two safetensors files hold the same tensors bit for bit."""
    a, _ = st_load(pa)
    b, _ = st_load(pb)
    if sorted(a) != sorted(b):
        return f"{pb.name}: keys {sorted(b)} vs {sorted(a)}"
    for k in sorted(a):
        if a[k].shape != b[k].shape:
            return f"{pb.name} {k}: shape {b[k].shape} vs {a[k].shape}"
        neq = a[k].view(np.uint32) != b[k].view(np.uint32)
        if neq.any():
            return (f"{pb.name} {k}: {int(neq.sum())}/{neq.size} elements not bitwise equal, "
                    f"max abs diff {np.abs(a[k].astype(np.float64) - b[k]).max():.3g}")
    return None


CASES = {
    # optimizer, extra spec keys, whether PyTorch can follow (shuffle false), every_steps,
    # the checkpoint to resume from
    "sgd_momentum": ({"type": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4}, {}, True, 5, 10),
    "adamw": ({"type": "adamw", "lr": 5e-3, "weight_decay": 0.05}, {}, True, 5, 10),
    # shuffled and accumulated: resume must restore the epoch's permutation and position
    "adamw_shuffle_accum2": ({"type": "adamw", "lr": 5e-3}, {"grad_accum": 2}, False, 5, 10),
    # a checkpoint taken as an epoch ends (8 steps per epoch): resume starts the next one
    "sgd_epoch_boundary": ({"type": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True}, {}, True, 8, 8),
    "adamw_shuffle_epoch_boundary": ({"type": "adamw", "lr": 5e-3}, {}, False, 8, 16),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_resume_from_checkpoint(work, case):
    optimizer, extra, follow, every, at = CASES[case]
    # 36 samples in batches of 5 = 8 batches per epoch (the last of 1): 20 steps cross
    # epochs, and step 10 is in the middle of one
    x, y = make_xy(36, 8, 3, "cross_entropy", seed=30)
    spec = spec_of(optimizer, steps=20, checkpoint={"every_steps": every}, **extra)
    init_sd = init_weights(MODEL, 31)
    spec, data = write_case(work, spec, x, y, init_sd)
    spec["data"]["shuffle"] = not follow
    if not follow:
        spec["data"]["seed"] = 7

    full = run_ddpd(spec, data, work / "full").check_ok()
    assert sorted(full.losses()) == list(range(1, 21))
    want_ckpts = set(range(every, 20, every))
    ckpts = sorted(int(p.name.split("-")[1]) for p in full.out.glob("ckpt-*"))
    assert want_ckpts <= set(ckpts) <= want_ckpts | {20}, f"checkpoint folders: {ckpts}"
    ev_steps = sorted(int(e["step"]) for e in full.of("checkpoint"))
    assert want_ckpts <= set(ev_steps), f"checkpoint events at steps {ev_steps}"
    for c in ckpts:
        _, meta = st_load(full.out / f"ckpt-{c}" / "optim.safetensors")
        assert meta.get("step") == str(c), f"ckpt-{c}/optim.safetensors metadata {meta}"
        st_load(full.out / f"ckpt-{c}" / "model.safetensors")
    assert not leftovers(full.out), f"temporary files left: {leftovers(full.out)}"

    if follow:
        ref = Reference(spec, data, init_sd, snapshot_steps=(at,))
        msg = compare_losses(full.losses(), ref.losses)
        assert msg is None, msg
        w, _ = st_load(full.out / f"ckpt-{at}" / "model.safetensors")
        o, _ = st_load(full.out / f"ckpt-{at}" / "optim.safetensors")
        msg = compare_tensors(w, ref.snapshots[at][0], what=f"ckpt-{at} model")
        assert msg is None, msg
        msg = compare_tensors(o, ref.snapshots[at][1], what=f"ckpt-{at} optimizer state")
        assert msg is None, msg

    res = run_ddpd(spec, data, work / "resumed", resume=full.out / f"ckpt-{at}").check_ok()
    got = res.losses()
    want = {s: l for s, l in full.losses().items() if s > at}
    assert sorted(got) == list(range(at + 1, 21)), f"resumed run logged steps {sorted(got)}"
    diff = [(s, got[s], want[s]) for s in sorted(want) if float(got[s]) != float(want[s])]
    assert not diff, f"resumed losses differ from the uninterrupted run (step, resumed, full): {diff}"
    assert res.of("done")[-1]["steps"] in (20 - at, 20), res.of("done")

    for name in ("model.safetensors", "optim.safetensors"):
        msg = bitwise_diff(full.out / name, res.out / name)
        assert msg is None, f"after resuming from ckpt-{at}: {msg}"
        ma, mb = st_load(full.out / name)[1], st_load(res.out / name)[1]
        if name == "optim.safetensors":
            assert ma.get("step") == mb.get("step") == "20", (ma, mb)
    later = sorted(c for c in want_ckpts if c > at)
    for c in later:
        assert (res.out / f"ckpt-{c}").is_dir(), f"the resumed run writes ckpt-{c} too"
        for name in ("model.safetensors", "optim.safetensors"):
            msg = bitwise_diff(full.out / f"ckpt-{c}" / name, res.out / f"ckpt-{c}" / name)
            assert msg is None, f"ckpt-{c} of the resumed run: {msg}"
    assert not leftovers(res.out), f"temporary files left: {leftovers(res.out)}"
