"""test_ddp.py — `ddpd run --world-size W` against real PyTorch 1.13 DistributedDataParallel
(gloo, CPU, one process per rank; DDP.md §2.4, §3, §4).

Every case runs the same job twice: with ddpd, and with PyTorch DDP from the same initial
weights on the same per-rank batches (`ddp.no_sync()` for the first k−1 micro-batches of a
step, `ddp.join(divide_by_initial_world_size=…)` around each epoch when the batch counts
differ). Compared: every rank's per-step loss (1e-5 relative, 1e-7 floor), the final
weights (rank 0's model.safetensors vs PyTorch rank 0's state_dict after the join:
1e-5 + 1e-5·|ref|), and the steps at which ranks joined.

Cases: W=2 MLP mse sgd; W=3 cross_entropy momentum; W=4 nesterov + weight decay; W=2
no_sync k=4 (with a leftover step); join W=2 uneven, divisor W and divisor |live| (with
momentum, 2 epochs, so the unsynced optimizer state matters); join + no_sync; many
buckets (bucket_cap_mb 0.001), also under join with W=3; adamw; DDP.md §4.3's divisor
pattern (W=3, batch counts 2,3,5, both settings); sharded data with auto join where the
last joiner is not rank W−1; W=4 staggered joins (counts 1,4,2,3); AdamW under join over two
epochs; drop_last making shards uneven; join forced on with even counts; a rank with zero
batches; DDP.md §4.6's worked example (no PyTorch needed; also checked
against PyTorch); W=2 equal shards = W=1 on the concatenated batch (no PyTorch needed).
"""
from pathlib import Path

import numpy as np
import pytest

from pylib import ddp as H


@pytest.fixture(autouse=True)
def _skip_code(request):
    H.install_skip_code(request.config)


@pytest.fixture
def work(tmp_path):
    return H.workdir("ddp-parity-") if H.os.environ.get("DDPD_TEST_TMP") else tmp_path


def spec_of(model, loss, optimizer, batch_size, epochs=1, grad_accum=1, ddp=None, name="ddp-parity"):
    s = {"name": name, "device": "cpu", "model": model, "loss": loss, "optimizer": optimizer,
         "batch_size": batch_size, "epochs": epochs, "grad_accum": grad_accum, "log_every": 1}
    if ddp:
        s["ddp"] = ddp
    return s


def check_parity(case, work, check_ref_replicas=True):
    """Runs the case with ddpd and with PyTorch DDP and compares everything."""
    H.need_bin()
    H.need_torch()
    spec = case.write(Path(work) / "data")
    run = H.run_ddpd(spec, case.world, work)
    run.check_ok(case.world)
    ref = H.torch_ddp(case, work)

    # The reference itself: after the (join) final sync all PyTorch replicas are equal.
    if check_ref_replicas:
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

    # join events: a rank out of batches says so at its last own step of each epoch
    for r in range(case.world):
        got = sorted(int(e["step"]) for e in run.of("join", r))
        if got != sorted(ref[r]["joins"]):
            problems.append(f"rank {r}: join events at steps {got}, PyTorch's rank ran out after steps {ref[r]['joins']}")

    # loss events carry the epoch of their step
    S = max(case.steps_per_epoch())
    for e in run.of("loss"):
        if int(e.get("epoch", -1)) != (int(e["step"]) - 1) // S:
            problems.append(f"loss event {e} has epoch {e.get('epoch')}, want {(int(e['step']) - 1) // S}")
            break
    done = {e["rank"]: e for e in run.of("done")}
    total = S * case.spec.get("epochs", 1)
    for r, d in done.items():
        if "steps" in d and int(d["steps"]) != total:
            problems.append(f"rank {r}: done event says {d['steps']} steps, want {total} (steps count globally)")

    assert not problems, "ddpd differs from PyTorch DDP:\n" + "\n".join(problems) + "\n\n" + run.describe()
    return run, ref


# ---------------------------------------------------------------------------------------
# even shards


def test_w2_mlp_mse_sgd(work):
    model = H.mlp(6, 16, 3)
    x, y = H.make_xy(40, 6, 3, "mse", seed=11)
    spec = spec_of(model, "mse", {"type": "sgd", "lr": 0.1}, batch_size=4, epochs=2)
    check_parity(H.Case.sharded(spec, 2, x, y, H.init_weights(model, 1)), work)


def test_w3_cross_entropy_momentum(work):
    model = H.mlp(5, 12, 4, act="tanh")
    x, y = H.make_xy(45, 5, 4, "cross_entropy", seed=12)
    spec = spec_of(model, "cross_entropy", {"type": "sgd", "lr": 0.1, "momentum": 0.9}, batch_size=4, epochs=2)
    check_parity(H.Case.sharded(spec, 3, x, y, H.init_weights(model, 2)), work)


def test_w4_nesterov_weight_decay(work):
    model = H.mlp(4, 10, 8, 3)
    x, y = H.make_xy(64, 4, 3, "mse", seed=13)
    opt = {"type": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}
    spec = spec_of(model, "mse", opt, batch_size=4, epochs=2)
    check_parity(H.Case.sharded(spec, 4, x, y, H.init_weights(model, 3)), work)


def test_w2_no_sync_grad_accum_4(work):
    # 20 samples per rank, batch 2 -> 10 micro-batches -> steps of 4, 4 and a leftover 2
    model = H.mlp(6, 16, 2)
    x, y = H.make_xy(40, 6, 2, "mse", seed=14)
    spec = spec_of(model, "mse", {"type": "sgd", "lr": 0.05, "momentum": 0.5}, batch_size=2, epochs=2, grad_accum=4)
    check_parity(H.Case.sharded(spec, 2, x, y, H.init_weights(model, 4)), work)


def test_w2_adamw(work):
    model = H.mlp(6, 16, 3)
    x, y = H.make_xy(40, 6, 3, "mse", seed=19)
    opt = {"type": "adamw", "lr": 0.01, "weight_decay": 0.01}
    spec = spec_of(model, "mse", opt, batch_size=4, epochs=2)
    check_parity(H.Case.sharded(spec, 2, x, y, H.init_weights(model, 9)), work)


# ---------------------------------------------------------------------------------------
# uneven inputs: join


@pytest.mark.parametrize("divide", [True, False], ids=["divide_by_W", "divide_by_live"])
def test_join_w2_uneven(work, divide):
    # rank 0: 19 samples -> 7 batches of 3 (last one 1 sample); rank 1: 31 -> 11 batches.
    # Momentum and two epochs: rank 0's momentum buffer is not synced at the join, so
    # its epoch-1 trajectory differs from rank 1's until the final sync.
    model = H.mlp(5, 12, 3)
    x, y = H.make_xy(50, 5, 3, "mse", seed=15)
    spec = spec_of(model, "mse", {"type": "sgd", "lr": 0.05, "momentum": 0.9}, batch_size=3, epochs=2,
                   ddp={"join": True, "divide_by_initial_world_size": divide})
    check_parity(H.Case.per_rank(spec, [x[:19], x[19:]], [y[:19], y[19:]], H.init_weights(model, 5)), work)


def test_join_with_no_sync(work):
    # grad_accum 2, rank 0 has 4 batches, rank 1 has 8: the sync pattern is the same on
    # every rank (PyTorch needs that), rank 0 shadows rank 1's no_sync steps too.
    model = H.mlp(5, 12, 4)
    x, y = H.make_xy(24, 5, 4, "cross_entropy", seed=16)
    spec = spec_of(model, "cross_entropy", {"type": "sgd", "lr": 0.1, "momentum": 0.9}, batch_size=2, epochs=2,
                   grad_accum=2)
    check_parity(H.Case.per_rank(spec, [x[:8], x[8:]], [y[:8], y[8:]], H.init_weights(model, 6)), work)


def test_sharded_auto_join_last_joiner_not_highest_rank(work):
    # 11 samples over 3 ranks, batch 1: counts 4, 4, 3 -> join is on ("auto"); the final
    # sync comes from rank 1 (the highest rank with the most batches), not rank 2.
    model = H.mlp(3, 6, 2)
    x, y = H.make_xy(11, 3, 2, "mse", seed=17)
    spec = spec_of(model, "mse", {"type": "sgd", "lr": 0.1, "momentum": 0.9}, batch_size=1, epochs=2)
    case = H.Case.sharded(spec, 3, x, y, H.init_weights(model, 7))
    assert case.batch_counts() == [4, 4, 3]
    check_parity(case, work)


def test_join_w4_staggered_divide_by_live(work):
    # batch counts 1, 4, 2, 3: ranks join at three different steps; the only rank with the
    # most batches is rank 1, so the final sync comes from rank 1.
    model = H.mlp(4, 10, 3)
    x, y = H.make_xy(10 * 2, 4, 3, "cross_entropy", seed=22)
    spec = spec_of(model, "cross_entropy", {"type": "sgd", "lr": 0.2, "momentum": 0.9}, batch_size=2, epochs=2,
                   ddp={"divide_by_initial_world_size": False})
    cut = [0, 2, 10, 14, 20]
    xs = [x[cut[i]:cut[i + 1]] for i in range(4)]
    ys = [y[cut[i]:cut[i + 1]] for i in range(4)]
    case = H.Case.per_rank(spec, xs, ys, H.init_weights(model, 12))
    assert case.batch_counts() == [1, 4, 2, 3]
    check_parity(case, work)


def test_rank_with_zero_batches(work):
    # 2 samples over 3 ranks: rank 2 has no batch at all and shadows every step (one of
    # PyTorch's own uneven-input cases, DDP.md §8 item 6)
    model = H.mlp(3, 5, 2)
    x, y = H.make_xy(2, 3, 2, "mse", seed=26)
    spec = spec_of(model, "mse", {"type": "sgd", "lr": 0.1, "momentum": 0.9}, batch_size=1, epochs=2)
    case = H.Case.sharded(spec, 3, x, y, H.init_weights(model, 16))
    assert case.batch_counts() == [1, 1, 0]
    check_parity(case, work)


def test_join_w3_adamw_two_epochs(work):
    # AdamW state (moments and step count) is not synced at the join either: in epoch 1
    # the ranks that joined early run with fewer Adam steps than rank 2.
    model = H.mlp(5, 12, 3)
    x, y = H.make_xy(30, 5, 3, "mse", seed=23)
    spec = spec_of(model, "mse", {"type": "adamw", "lr": 0.01, "weight_decay": 0.05}, batch_size=3, epochs=2)
    case = H.Case.per_rank(spec, [x[:6], x[6:15], x[15:]], [y[:6], y[6:15], y[15:]], H.init_weights(model, 13))
    assert case.batch_counts() == [2, 3, 5]
    check_parity(case, work)


def test_sharded_drop_last_uneven(work):
    # 11 samples over 2 ranks (6 and 5), batch 2, drop_last: 3 and 2 batches -> join
    model = H.mlp(3, 8, 2)
    x, y = H.make_xy(11, 3, 2, "mse", seed=24)
    spec = spec_of(model, "mse", {"type": "sgd", "lr": 0.1}, batch_size=2, epochs=2)
    spec["data"] = {"drop_last": True}
    case = H.Case.sharded(spec, 2, x, y, H.init_weights(model, 14))
    assert case.batch_counts() == [3, 2]
    check_parity(case, work)


def test_join_true_with_even_inputs(work):
    # join forced on with even counts changes nothing (PyTorch runs under ddp.join too)
    model = H.mlp(4, 8, 2)
    x, y = H.make_xy(24, 4, 2, "mse", seed=25)
    spec = spec_of(model, "mse", {"type": "sgd", "lr": 0.1, "momentum": 0.9}, batch_size=2, epochs=2,
                   grad_accum=2, ddp={"join": True, "divide_by_initial_world_size": False})
    check_parity(H.Case.sharded(spec, 3, x, y, H.init_weights(model, 15)), work)


# ---------------------------------------------------------------------------------------
# buckets


@pytest.mark.parametrize("world,uneven", [(2, False), (3, True)], ids=["w2_even", "w3_join"])
def test_many_buckets(work, world, uneven):
    # bucket_cap_mb 0.001 = 1048 bytes = 262 floats: almost every tensor its own bucket
    model = H.mlp(8, 32, 32, 4)
    cap = {"bucket_cap_mb": 0.001}
    if uneven:
        x, y = H.make_xy(12 * 4 + 2, 8, 4, "mse", seed=18)
        spec = spec_of(model, "mse", {"type": "sgd", "lr": 0.05, "momentum": 0.9}, batch_size=4, epochs=1,
                       ddp=dict(cap, join="auto"))
        case = H.Case.sharded(spec, world, x, y, H.init_weights(model, 8))
        assert len(set(case.batch_counts())) > 1, case.batch_counts()
    else:
        x, y = H.make_xy(48, 8, 4, "mse", seed=18)
        spec = spec_of(model, "mse", {"type": "sgd", "lr": 0.05, "momentum": 0.9}, batch_size=4, epochs=2, ddp=cap)
        case = H.Case.sharded(spec, world, x, y, H.init_weights(model, 8))
    check_parity(case, work)


# ---------------------------------------------------------------------------------------
# DDP.md §4.3: the divisor pattern, W=3, batch counts 2, 3, 5

X_1D = [np.array([1.0, -2.0], np.float32), np.array([2.0, 1.0, -1.0], np.float32),
        np.array([1.0, 3.0, -1.0, 2.0, 1.0], np.float32)]
Y_1D = [np.array([2.0, 1.0], np.float32), np.array([0.5, -1.0, 2.0], np.float32),
        np.array([-1.0, 2.0, 1.0, 0.0, 3.0], np.float32)]
ONE_D = [{"type": "linear", "in": 1, "out": 1, "bias": False}]


@pytest.mark.parametrize("divide", [True, False], ids=["divide_by_W", "divide_by_live"])
def test_divisor_pattern_w3_1d(work, divide):
    """ŷ = w·x, batch 1: each step's loss on each rank shows the weight before that step,
    so the losses and the final weight show every applied gradient. Checked against the
    DDP.md §4 simulator and against PyTorch."""
    spec = spec_of(ONE_D, "mse", {"type": "sgd", "lr": 0.02}, batch_size=1,
                   ddp={"divide_by_initial_world_size": divide})
    xs = [v[:, None] for v in X_1D]
    ys = [v[:, None] for v in Y_1D]
    case = H.Case.per_rank(spec, xs, ys, {"0.weight": np.array([[0.5]], np.float32)})
    assert case.batch_counts() == [2, 3, 5]
    run, ref = check_parity(case, work)
    sim_losses, sim_w = H.simulate_1d(X_1D, Y_1D, 0.5, 0.02, divide=divide)
    m = H.compare_all_losses(run.losses(), sim_losses)
    assert m is None, "ddpd differs from the DDP.md §4.3 simulator:\n" + m
    got = float(run.model()["0.weight"][0, 0])
    assert abs(got - sim_w) <= 1e-5 + 1e-5 * abs(sim_w), f"final w {got} vs simulator {sim_w}"


@pytest.mark.parametrize("divide", [True, False], ids=["divide_by_W", "divide_by_live"])
def test_divisor_pattern_w3_mlp(work, divide):
    # 3, 6, 9 samples with batch 2 -> 2, 3, 5 batches (the last of 9 is a single sample)
    model = H.mlp(4, 8, 2, act="tanh")
    x, y = H.make_xy(18, 4, 2, "mse", seed=20)
    spec = spec_of(model, "mse", {"type": "sgd", "lr": 0.1}, batch_size=2,
                   ddp={"divide_by_initial_world_size": divide})
    case = H.Case.per_rank(spec, [x[:3], x[3:9], x[9:]], [y[:3], y[3:9], y[9:]], H.init_weights(model, 10))
    assert case.batch_counts() == [2, 3, 5]
    check_parity(case, work)


# ---------------------------------------------------------------------------------------
# DDP.md §4.6's worked example (no PyTorch needed)

X46 = [np.array([[1], [2], [3]], np.float32), np.array([[1], [1], [2], [2], [1]], np.float32)]
Y46 = [np.array([[0], [1], [1]], np.float32), np.array([[2], [1], [0], [3], [1]], np.float32)]
# The doc's ½(w·x−y)² with lr 0.1 is the contract's (w·x−y)² with lr 0.05.
CASES46 = [(True, 0.0, 0.6884), (False, 0.0, 0.8911), (True, 0.9, -0.051625)]


def case46(divide, momentum):
    spec = spec_of(ONE_D, "mse", {"type": "sgd", "lr": 0.05, "momentum": momentum}, batch_size=1,
                   ddp={"divide_by_initial_world_size": divide}, name="ddp-md-4-6")
    return H.Case.per_rank(spec, X46, Y46, {"0.weight": np.array([[1.0]], np.float32)})


@pytest.mark.parametrize("divide,momentum,want", CASES46, ids=["default", "divide_false", "momentum"])
def test_worked_example_4_6(work, divide, momentum, want):
    H.need_bin()
    case = case46(divide, momentum)
    spec = case.write(work / "data")
    run = H.run_ddpd(spec, 2, work)
    run.check_ok(2)
    got = float(run.model()["0.weight"][0, 0])
    sim_losses, sim_w = H.simulate_1d([v[:, 0] for v in X46], [v[:, 0] for v in Y46], 1.0, 0.05, momentum, divide)
    assert abs(sim_w - want) < 1e-9  # the simulator reproduces the doc
    problems = []
    if not abs(got - want) <= 1e-5:
        problems.append(f"final w = {got!r}, DDP.md §4.6 says {want}")
    m = H.compare_all_losses(run.losses(), sim_losses)
    if m:
        problems.append(m)
    joins = [(e["rank"], e["step"]) for e in run.of("join")]
    if joins != [(0, 3)]:
        problems.append(f"join events {joins}, want rank 0 at step 3 only")
    assert not problems, "\n".join(problems) + "\n\n" + run.describe()


@pytest.mark.cpu_only("runs the PyTorch reference alone, no ddpd")
@pytest.mark.parametrize("divide,momentum,want", CASES46, ids=["default", "divide_false", "momentum"])
def test_worked_example_4_6_pytorch_reference(work, divide, momentum, want):
    """The PyTorch DDP reference used above gives DDP.md's numbers (a test of the test)."""
    H.need_torch()
    case = case46(divide, momentum)
    ref = H.torch_ddp(case, work)
    for r in range(2):
        w = float(ref[r]["state"]["0.weight"][0, 0])
        assert abs(w - want) <= 1e-5, f"PyTorch rank {r}: w = {w}, DDP.md §4.6 says {want}"
    assert ref[0]["joins"] == [3] and ref[1]["joins"] == []
    if momentum:  # momentum buffers are not synced: doc's 5.25 vs 1.79125 (×2 for (w·x−y)²)
        b0 = float(ref[0]["optim"]["0.weight.momentum_buffer"][0, 0])
        b1 = float(ref[1]["optim"]["0.weight.momentum_buffer"][0, 0])
        assert abs(b0 - 10.5) < 1e-4 and abs(b1 - 3.5825) < 1e-4, (b0, b1)


# ---------------------------------------------------------------------------------------
# W=2 equal shards = W=1 on the concatenated batch (no PyTorch needed)


def test_w2_equals_w1_on_concatenated_batch(work):
    """Rank r takes samples r, r+2, …; with batch b its j-th batch holds samples 2jb+r+2i,
    so the two ranks' j-th batches together are samples 2jb … 2jb+2b−1 — the W=1 run's
    j-th batch of size 2b. Mean losses: the DDP average of the two gradients equals the
    W=1 gradient, and the W=1 loss equals the mean of the ranks' losses."""
    H.need_bin()
    model = H.mlp(6, 16, 3)
    x, y = H.make_xy(48, 6, 3, "mse", seed=21)
    opt = {"type": "sgd", "lr": 0.1, "momentum": 0.9}
    init = H.init_weights(model, 11)
    spec2 = H.Case.sharded(spec_of(model, "mse", opt, batch_size=3, epochs=2), 2, x, y, init).write(work / "data")
    spec1 = dict(spec2, batch_size=6, world_size=1)
    r2 = H.run_ddpd(spec2, 2, work, name="w2")
    r2.check_ok(2)
    r1 = H.run_ddpd(spec1, 1, work, name="w1")
    r1.check_ok(1)
    l2, l1 = r2.losses(), r1.losses()
    assert sorted(l2) == [0, 1] and sorted(l2[0]) == sorted(l1[0]), (sorted(l2), sorted(l1))
    mean2 = {s: (l2[0][s] + l2[1][s]) / 2 for s in l2[0]}
    problems = [m for m in (H.compare_losses(mean2, l1[0], what="mean of the W=2 ranks' losses vs W=1"),
                            H.compare_tensors(r2.model(), r1.model(), what="W=2 vs W=1 final weights")) if m]
    assert not problems, "\n".join(problems) + "\n\n" + r2.describe()
