"""test_train.py — single-rank training parity with PyTorch 1.13: the same spec, data and
initial weights through `ddpd run` and through torch (float32, 1 thread); every logged
step's loss within 1e-5 relative (abs floor 1e-7), final weights and optimizer state
within 1e-5 + 1e-5*|ref| elementwise. Data in file order (shuffle false: ddpd's shuffle
RNG is its own) and init.from everywhere, so both sides see the same numbers."""
import numpy as np
import pytest

from pylib.parity import (Reference, compare_losses, compare_tensors, init_weights, make_xy, run_ddpd,
                      st_load, write_case, write_csv)


def mlp(*widths, act="relu", bias=True):
    """[linear, act, linear, act, ..., linear] for widths (in, h1, ..., out)."""
    layers = []
    for i in range(len(widths) - 1):
        if i:
            layers.append({"type": act})
        layers.append({"type": "linear", "in": widths[i], "out": widths[i + 1], "bias": bias})
    return layers


def base_spec(model, loss, optimizer, batch_size, **kw):
    s = {"name": "parity", "device": "cpu", "world_size": 1, "model": model, "loss": loss,
         "optimizer": optimizer, "batch_size": batch_size, "log_every": 1}
    s.update(kw)
    if "epochs" not in s and "steps" not in s:
        s["epochs"] = 1
    return s


def check_parity(work, spec, x, y, init_seed=0, check_epochs=False, expect_steps=None):
    """Runs one case on both sides and asserts parity. Returns (run, reference)."""
    init_sd = init_weights(spec["model"], init_seed)
    if x is not None:
        spec, data = write_case(work, spec, x, y, init_sd)
    else:
        spec, data = write_case(work, spec, None, None, init_sd)
    ref = Reference(spec, data, init_sd)
    if expect_steps is not None:
        assert ref.steps == expect_steps, "test bug: the reference plan has %d steps" % ref.steps
    run = run_ddpd(spec, data, work / "out").check_ok()

    start = run.of("start")
    assert start, "no start event\n" + run.describe()
    assert start[0]["params"] == ref.param_count(), "start.params"
    assert start[0]["batches"] == ref.batches_per_epoch, "start.batches (per epoch)"
    done = run.of("done")[-1]
    assert done["steps"] == ref.steps, "done.steps"

    got = run.losses()
    log_every = spec.get("log_every", 1)
    want = {s: l for s, l in ref.losses.items() if s % log_every == 0 or s == ref.steps}
    msg = compare_losses(got, want)
    assert msg is None, f"losses: {msg}"
    assert done["loss"] == pytest.approx(ref.losses[ref.steps], rel=1e-5, abs=1e-7), "done.loss = last step's loss"
    if check_epochs:
        ep = {int(e["step"]): e["epoch"] for e in run.of("loss")}
        assert ep == {s: ref.epochs[s] for s in want}, "loss events' epoch (0-based) per step"

    weights, _ = st_load(run.out / "model.safetensors")
    for k, v in weights.items():
        assert v.dtype == np.float32, f"{k}: dtype {v.dtype}, want F32"
    msg = compare_tensors(weights, ref.state_dict())
    assert msg is None, f"final model.safetensors after {ref.steps} steps: {msg}"

    ostate, meta = st_load(run.out / "optim.safetensors")
    msg = compare_tensors(ostate, ref.optim_state(), what="optimizer state")
    assert msg is None, msg
    assert meta.get("step") == str(ref.steps), f"optim.safetensors __metadata__ step: {meta}"
    return run, ref


# (1) the seed example's shape: Linear(10,5), mse, sgd lr 0.01, batch 3
def test_linear_mse_sgd(work):
    x, y = make_xy(300, 10, 5, "mse", seed=1)
    spec = base_spec([{"type": "linear", "in": 10, "out": 5}], "mse", {"type": "sgd", "lr": 0.01}, 3)
    check_parity(work, spec, x, y, expect_steps=100)


# (2) MLP with relu, cross entropy, sgd momentum 0.9
def test_mlp_relu_ce_momentum(work):
    x, y = make_xy(256, 20, 4, "cross_entropy", seed=2)
    spec = base_spec(mlp(20, 32, 4), "cross_entropy", {"type": "sgd", "lr": 0.05, "momentum": 0.9}, 16, epochs=3)
    check_parity(work, spec, x, y, init_seed=2, expect_steps=48)


# (3) nesterov + weight decay
def test_sgd_nesterov_weight_decay(work):
    x, y = make_xy(200, 8, 3, "mse", seed=3)
    spec = base_spec(mlp(8, 16, 3, act="tanh"), "mse",
                     {"type": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3}, 10,
                     epochs=2)
    check_parity(work, spec, x, y, init_seed=3, expect_steps=40)


# (4) dampening (with weight decay, without nesterov, which forbids it)
def test_sgd_dampening(work):
    x, y = make_xy(160, 12, 6, "cross_entropy", seed=4)
    spec = base_spec(mlp(12, 24, 6), "cross_entropy",
                     {"type": "sgd", "lr": 0.1, "momentum": 0.8, "dampening": 0.3, "weight_decay": 1e-4}, 8,
                     epochs=2)
    check_parity(work, spec, x, y, init_seed=4, expect_steps=40)


# (5) adamw with weight decay: explicit hyper-parameters, and the defaults
def test_adamw_weight_decay(work):
    x, y = make_xy(240, 16, 5, "cross_entropy", seed=5)
    spec = base_spec(mlp(16, 32, 5), "cross_entropy",
                     {"type": "adamw", "lr": 2e-3, "betas": [0.85, 0.99], "eps": 1e-7, "weight_decay": 0.05}, 12,
                     epochs=2)
    check_parity(work, spec, x, y, init_seed=5, expect_steps=40)


def test_adamw_defaults_mse(work):
    x, y = make_xy(120, 6, 2, "mse", seed=51)
    spec = base_spec(mlp(6, 10, 2, act="tanh"), "mse", {"type": "adamw", "lr": 1e-3}, 4)
    check_parity(work, spec, x, y, init_seed=51, expect_steps=30)


# (6) every activation, two hidden layers
@pytest.mark.parametrize("act", ["tanh", "sigmoid", "gelu", "relu"])
def test_activation(work, act):
    x, y = make_xy(192, 6, 2, "mse", seed=6)
    spec = base_spec(mlp(6, 16, 16, 2, act=act), "mse", {"type": "sgd", "lr": 0.05, "momentum": 0.5}, 8, epochs=2)
    check_parity(work, spec, x, y, init_seed=60, expect_steps=48)


# (7) grad_accum 3 with a partial last batch, 2 epochs: 92 samples in batches of 8 = 11
# full batches + one of 4, i.e. 12 micro-batches = 4 optimizer steps per epoch
def test_grad_accum_partial_last_batch(work):
    x, y = make_xy(92, 10, 3, "cross_entropy", seed=7)
    spec = base_spec(mlp(10, 12, 3), "cross_entropy", {"type": "sgd", "lr": 0.05, "momentum": 0.9}, 8,
                     epochs=2, grad_accum=3)
    check_parity(work, spec, x, y, init_seed=7, check_epochs=True, expect_steps=8)


# (7b) grad_accum with mse and adamw (the sum of micro-batch gradients, not the mean)
def test_grad_accum_adamw_mse(work):
    x, y = make_xy(90, 5, 2, "mse", seed=71)
    spec = base_spec(mlp(5, 9, 2, act="gelu"), "mse", {"type": "adamw", "lr": 1e-2, "weight_decay": 0.1}, 5,
                     epochs=2, grad_accum=2)
    check_parity(work, spec, x, y, init_seed=71, expect_steps=18)


# (7c) grad_accum 3 that does not divide the 13 batches of an epoch (100 samples in
# batches of 8, the last of 4): each epoch ends with a step of the 1 micro-batch left
def test_grad_accum_epoch_remainder(work):
    x, y = make_xy(100, 10, 3, "cross_entropy", seed=72)
    spec = base_spec(mlp(10, 12, 3), "cross_entropy", {"type": "sgd", "lr": 0.05, "momentum": 0.9}, 8,
                     epochs=2, grad_accum=3)
    check_parity(work, spec, x, y, init_seed=72, check_epochs=True, expect_steps=10)


# (7d) the same with `steps` wrapping into the 3rd epoch (5 steps per epoch)
def test_grad_accum_steps_wrap(work):
    x, y = make_xy(100, 10, 3, "mse", seed=73)
    spec = base_spec(mlp(10, 12, 3, act="sigmoid"), "mse", {"type": "adamw", "lr": 3e-3}, 8,
                     steps=12, grad_accum=3)
    check_parity(work, spec, x, y, init_seed=73, check_epochs=True, expect_steps=12)


# (8) float64 x file and int64 / int32 labels
@pytest.mark.cpu_only("float64 x and int32 labels are converted on the host, before the device sees a batch")
@pytest.mark.parametrize("label_dtype", [np.int64, np.int32])
def test_float64_x_int_labels(work, label_dtype):
    x, y = make_xy(150, 7, 4, "cross_entropy", seed=8, x_dtype=np.float64, y_dtype=label_dtype)
    # keep the float64 values beyond float32 precision: ddpd must round them to float32 as we do
    x = x + np.random.default_rng(80).standard_normal(x.shape) * 1e-9
    assert x.dtype == np.float64 and y.dtype == label_dtype
    spec = base_spec(mlp(7, 11, 4), "cross_entropy", {"type": "sgd", "lr": 0.1}, 10)
    check_parity(work, spec, x, y, init_seed=8, expect_steps=15)


# (9) CSV data: a single `target` column (class ids), and a list of target columns in
# the middle of the feature columns (mse)
@pytest.mark.cpu_only("the CSV reader is host code: the device trains on the batches it reads")
def test_csv_target_column(work):
    x, y = make_xy(120, 5, 3, "cross_entropy", seed=9)
    data = work / "data"
    data.mkdir(parents=True)
    write_csv(data / "train.csv", x, y, ["target"], "cross_entropy")
    spec = base_spec(mlp(5, 8, 3), "cross_entropy", {"type": "sgd", "lr": 0.1, "momentum": 0.9}, 8,
                     data={"type": "csv", "path": "train.csv", "target": "target", "shuffle": False})
    check_parity(work, spec, None, None, init_seed=9, expect_steps=15)


@pytest.mark.cpu_only("the CSV reader is host code: the device trains on the batches it reads")
def test_csv_target_list_mse(work):
    x, y = make_xy(100, 4, 2, "mse", seed=91)
    data = work / "data"
    data.mkdir(parents=True)
    write_csv(data / "train.csv", x, y, ["t0", "t1"], "mse", target_pos=2)
    spec = base_spec(mlp(4, 6, 2), "mse", {"type": "sgd", "lr": 0.05}, 10,
                     data={"type": "csv", "path": "train.csv", "target": ["t0", "t1"], "shuffle": False})
    check_parity(work, spec, None, None, init_seed=91, expect_steps=10)


# (10) `steps` larger than one epoch: 50 samples in batches of 8 = 7 batches (the last of
# 2), 30 steps wrap into a 5th epoch
def test_steps_wrap_epochs(work):
    x, y = make_xy(50, 6, 3, "mse", seed=10)
    spec = base_spec(mlp(6, 8, 3), "mse", {"type": "sgd", "lr": 0.05, "momentum": 0.9}, 8, steps=30)
    check_parity(work, spec, x, y, init_seed=10, check_epochs=True, expect_steps=30)


# (11) linear layers without bias, and drop_last
def test_no_bias_drop_last(work):
    x, y = make_xy(70, 6, 3, "cross_entropy", seed=11)
    spec = base_spec(mlp(6, 8, 3, bias=False), "cross_entropy", {"type": "sgd", "lr": 0.1, "momentum": 0.9}, 8,
                     epochs=2, data={"drop_last": True})
    check_parity(work, spec, x, y, init_seed=11, expect_steps=16)


# (12) log_every: only every 4th step and the last one are logged
def test_log_every(work):
    x, y = make_xy(66, 5, 2, "mse", seed=12)
    spec = base_spec(mlp(5, 2), "mse", {"type": "sgd", "lr": 0.05}, 3, log_every=4)
    run, ref = check_parity(work, spec, x, y, init_seed=12, expect_steps=22)
    assert sorted(run.losses()) == [4, 8, 12, 16, 20, 22]


# (13) a wider MLP, so the BLAS takes its blocked paths: 64-200-gelu-96-relu-10, adamw
def test_wider_mlp_adamw(work):
    x, y = make_xy(320, 64, 10, "cross_entropy", seed=13)
    model = [{"type": "linear", "in": 64, "out": 200}, {"type": "gelu"},
             {"type": "linear", "in": 200, "out": 96}, {"type": "relu"},
             {"type": "linear", "in": 96, "out": 10}]
    spec = base_spec(model, "cross_entropy", {"type": "adamw", "lr": 1e-3}, 32, epochs=2)
    check_parity(work, spec, x, y, init_seed=13, expect_steps=20)
