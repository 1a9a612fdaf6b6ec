"""test_comm_hook.py — `ddp.comm_hook` "fp16" and "bf16" (issue 33) against PyTorch 1.13 DDP
over gloo with the same hook registered (`ddp.register_comm_hook(None, fp16_compress_hook)`).

fp16: PyTorch's own fp16_compress_hook, gloo's own fp16 all-reduce (a ring whose every add
rounds to fp16). bf16: gloo has no bfloat16 all-reduce on the CPU in 1.13, so the
reference registers pylib.ddp.bf16_hook_gloo: bf16_compress_hook's code (cast to bfloat16,
div_ by W in bfloat16, copy back) with the all-reduce emulated as gloo's ring would sum
bfloat16: every rank's values all-gathered exactly (as floats) and summed per element in
gloo's ring order with bfloat16 rounding after each add (bf16_ring_sum; the same order as
gloo's fp16 sum, which test_half.c and the fp16 cases here check against gloo itself).

Compared as test_ddp.py compares: every rank's per-step loss (1e-5 relative, 1e-7 floor),
the final weights (1e-5 + 1e-5·|ref|), the join steps. Cases: W=2 and W=3, no_sync
(grad_accum 2), join on uneven inputs (the joined rank's shadow all-reduces go through the
hook, as PyTorch's join hook runs it on zero buckets), world 1 (PyTorch runs the hook even
then: gradients rounded to 16 bits), several buckets with W=3 (bucket_cap_mb 0.001), and
a check that the hook really changes the numbers (it is not the plain path by accident).
ddpd refuses the hook with device cuda (422 at ddp.comm_hook; tests/unit/schema/test_spec.c),
so every case here is cpu_only.
"""
from pathlib import Path

import numpy as np
import pytest

from pylib import ddp as H

pytestmark = pytest.mark.cpu_only("ddp.comm_hook is refused with device cuda (422 at ddp.comm_hook)")


@pytest.fixture(autouse=True)
def _skip_code(request):
    H.install_skip_code(request.config)


@pytest.fixture
def work(tmp_path):
    return H.workdir("hook-parity-") if H.os.environ.get("DDPD_TEST_TMP") else tmp_path


def spec_of(model, loss, optimizer, batch_size, hook, epochs=2, grad_accum=1, ddp=None):
    d = dict(ddp or {}, comm_hook=hook)
    return {"name": "hook-parity", "device": "cpu", "model": model, "loss": loss, "optimizer": optimizer,
            "batch_size": batch_size, "epochs": epochs, "grad_accum": grad_accum, "log_every": 1, "ddp": d}


def check_parity(case, work):
    H.need_bin()
    H.need_torch()
    spec = case.write(Path(work) / "data")
    run = H.run_ddpd(spec, case.world, work)
    run.check_ok(case.world)
    ref = H.torch_ddp(case, work)
    for r in range(1, case.world):
        m = H.compare_tensors(ref[r]["state"], ref[0]["state"], what=f"PyTorch rank {r} vs rank 0", rtol=0, atol=0)
        assert m is None, "reference replicas differ (test bug): " + m
    problems = []
    m = H.compare_all_losses(run.losses(), ref)
    if m:
        problems.append(m)
    m = H.compare_tensors(run.model(), ref[0]["state"])
    if m:
        problems.append(m)
    for r in range(case.world):
        got = sorted(int(e["step"]) for e in run.of("join", r))
        if got != sorted(ref[r]["joins"]):
            problems.append(f"rank {r}: join events at steps {got}, PyTorch's rank ran out after steps {ref[r]['joins']}")
    assert not problems, "ddpd differs from PyTorch DDP with the hook:\n" + "\n".join(problems) + "\n\n" + run.describe()
    return run, ref


HOOKS = ["fp16", "bf16"]


@pytest.mark.parametrize("hook", HOOKS)
def test_w2_mlp_mse_sgd(work, hook):
    model = H.mlp(6, 16, 3)
    x, y = H.make_xy(40, 6, 3, "mse", seed=11)
    spec = spec_of(model, "mse", {"type": "sgd", "lr": 0.1}, 4, hook)
    check_parity(H.Case.sharded(spec, 2, x, y, H.init_weights(model, 1)), work)


@pytest.mark.parametrize("hook", HOOKS)
def test_w3_cross_entropy_momentum(work, hook):
    model = H.mlp(5, 12, 4, act="tanh")
    x, y = H.make_xy(45, 5, 4, "cross_entropy", seed=12)
    spec = spec_of(model, "cross_entropy", {"type": "sgd", "lr": 0.1, "momentum": 0.9}, 4, hook)
    check_parity(H.Case.sharded(spec, 3, x, y, H.init_weights(model, 2)), work)


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("world", [2, 3])
def test_no_sync_grad_accum_2(work, hook, world):
    # 36 samples, batch 2: 6 micro-batches per rank at W=3 (9 at W=2: a leftover step);
    # the hook runs only on each step's last, syncing micro-batch, on the accumulated grads.
    model = H.mlp(6, 16, 2)
    x, y = H.make_xy(36, 6, 2, "mse", seed=14)
    spec = spec_of(model, "mse", {"type": "sgd", "lr": 0.05, "momentum": 0.5}, 2, hook, grad_accum=2)
    check_parity(H.Case.sharded(spec, world, x, y, H.init_weights(model, 4)), work)


@pytest.mark.parametrize("hook", HOOKS)
def test_join_w2_uneven(work, hook):
    # rank 0: 19 samples -> 7 batches of 3; rank 1: 31 -> 11. Rank 0 shadows 4 steps per
    # epoch through the hook (zeros cast, divided and summed in 16 bits).
    model = H.mlp(5, 12, 3)
    x, y = H.make_xy(50, 5, 3, "mse", seed=15)
    spec = spec_of(model, "mse", {"type": "sgd", "lr": 0.05, "momentum": 0.9}, 3, hook, ddp={"join": True})
    check_parity(H.Case.per_rank(spec, [x[:19], x[19:]], [y[:19], y[19:]], H.init_weights(model, 5)), work)


@pytest.mark.parametrize("hook", HOOKS)
def test_join_w3_with_no_sync(work, hook):
    # Batch counts 4, 6, 8 with grad_accum 2: staggered joins, shadowed no_sync steps.
    model = H.mlp(5, 12, 4)
    x, y = H.make_xy(36, 5, 4, "cross_entropy", seed=16)
    spec = spec_of(model, "cross_entropy", {"type": "sgd", "lr": 0.1, "momentum": 0.9}, 2, hook, grad_accum=2)
    xs, ys = [x[:8], x[8:20], x[20:]], [y[:8], y[8:20], y[20:]]
    check_parity(H.Case.per_rank(spec, xs, ys, H.init_weights(model, 6)), work)


@pytest.mark.parametrize("hook", HOOKS)
def test_w3_many_buckets(work, hook):
    # bucket_cap_mb 0.001 (1048 bytes): a bucket per parameter or two, each its own gloo
    # chunk layout. PyTorch's first step has one bucket in registration order (DDP.md §2.2)
    # where ddpd has its rebuilt plan from the start: with W=3 a chunk boundary may give an
    # element another add order in step 1 only, within the tolerances.
    model = H.mlp(6, 20, 12, 3)
    x, y = H.make_xy(48, 6, 3, "mse", seed=17)
    spec = spec_of(model, "mse", {"type": "sgd", "lr": 0.05}, 4, hook, ddp={"bucket_cap_mb": 0.001})
    check_parity(H.Case.sharded(spec, 3, x, y, H.init_weights(model, 7)), work)


@pytest.mark.parametrize("hook", HOOKS)
def test_world_1_rounds(work, hook):
    # No collective, yet PyTorch runs the hook: every gradient rounded to 16 bits.
    model = H.mlp(6, 16, 3)
    x, y = H.make_xy(24, 6, 3, "mse", seed=18)
    spec = spec_of(model, "mse", {"type": "sgd", "lr": 0.1}, 4, hook)
    check_parity(H.Case.sharded(spec, 1, x, y, H.init_weights(model, 8)), work)


def test_hook_changes_the_numbers(work):
    # The same job without a hook ends elsewhere (beyond the tolerance): the comparisons
    # above would notice a hook that silently did nothing.
    H.need_bin()
    model = H.mlp(6, 16, 3)
    x, y = H.make_xy(40, 6, 3, "mse", seed=11)
    finals = {}
    for hook in ["none", "bf16"]:
        spec = spec_of(model, "mse", {"type": "sgd", "lr": 0.1}, 4, hook)
        w = Path(work) / hook
        w.mkdir()
        s = H.Case.sharded(spec, 2, x, y, H.init_weights(model, 1)).write(w / "data")
        run = H.run_ddpd(s, 2, w)
        run.check_ok(2)
        finals[hook] = run.model()
    diff = max(float(np.max(np.abs(finals["none"][k] - finals["bf16"][k]))) for k in finals["none"])
    assert diff > 1e-4, f"bf16 and no hook end {diff} apart: the hook changed nothing"
