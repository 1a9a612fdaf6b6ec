"""test_bad_data.py — `ddpd run` with broken inputs: each data file that does not parse
(truncated or wrong-dtype .npy, a CSV text cell, a NaN or infinite cell or a repeated
header name in a {rank} CSV file, a missing file, y of the wrong length, ...) ends the job with exit code 2 and an `error` event whose message names the file,
the log says it too, and nothing crashes. An invalid spec file is exit code 2 naming the
JSON path (CONTRACT.md §2, §3, §6)."""

import numpy as np
import pytest

from pylib import parity as h

CRASH_MARKS = ("Traceback", "Segmentation fault", "AddressSanitizer", "UndefinedBehaviorSanitizer",
               "runtime error:", "core dumped", "Assertion", "Aborted", "SIGSEGV", "panic")


@pytest.fixture(autouse=True)
def _skip_code(request):
    h.install_skip_code(request.config)


@pytest.fixture
def work(request, tmp_path, _skip_code):
    yield from h.workdir(request, tmp_path, "e2e-bad-data-")


MODEL = [{"type": "linear", "in": 4, "out": 6}, {"type": "relu"}, {"type": "linear", "in": 6, "out": 3}]


def spec_npy(loss="cross_entropy", x="x.npy", y="y.npy"):
    return {"name": "bad-data", "device": "cpu", "model": MODEL, "loss": loss,
            "optimizer": {"type": "sgd", "lr": 0.1}, "data": {"type": "npy", "x": x, "y": y, "shuffle": False},
            "batch_size": 4, "epochs": 1, "init": {"seed": 0}}


def good_data(data, n=20, loss="cross_entropy"):
    data.mkdir(parents=True, exist_ok=True)
    x, y = h.make_xy(n, 4, 3, loss, seed=1)
    np.save(data / "x.npy", x)
    np.save(data / "y.npy", y)
    return x, y


def expect_bad(run, name, kind=None):
    """exit code 2, an error event naming `name`, the log or stderr naming it too, and
    no sign of a crash."""
    assert run.rc == 2, f"want exit code 2\n{run.describe()}"
    assert not run.bad_lines, f"non-JSON lines on stdout: {run.bad_lines[:5]}"
    errs = run.of("error")
    assert errs, f"no error event\n{run.describe()}"
    assert any(name in e.get("message", "") for e in errs), f"no error event names {name!r}: {errs}"
    if kind:
        assert any(e.get("kind") == kind for e in errs), f"want an error of kind {kind!r}: {errs}"
    assert name in run.stderr or name in run.log_text(), f"neither stderr nor rank-0.log names {name!r}\n{run.describe()}"
    text = run.stdout + run.stderr + run.log_text()
    for m in CRASH_MARKS:
        assert m not in text, f"crash marker {m!r} in the output\n{run.describe()}"
    assert not run.of("done"), "a done event after an error"


def run_case(work, spec):
    return h.run_ddpd(spec, work / "data", work / "out", timeout=60)


def test_truncated_npy_data(work):
    good_data(work / "data")
    b = (work / "data" / "x.npy").read_bytes()
    (work / "data" / "x_cut.npy").write_bytes(b[:-7])
    expect_bad(run_case(work, spec_npy(x="x_cut.npy")), "x_cut.npy", "data")


def test_truncated_npy_header(work):
    good_data(work / "data")
    b = (work / "data" / "y.npy").read_bytes()
    (work / "data" / "y_cut.npy").write_bytes(b[:30])
    expect_bad(run_case(work, spec_npy(y="y_cut.npy")), "y_cut.npy", "data")


def test_not_an_npy_file(work):
    good_data(work / "data")
    (work / "data" / "x_text.npy").write_text("this is not numpy\n" * 10)
    expect_bad(run_case(work, spec_npy(x="x_text.npy")), "x_text.npy", "data")


@pytest.mark.parametrize("dtype", ["<U3", "complex64", "int8"])
def test_npy_wrong_dtype_x(work, dtype):
    x, _ = good_data(work / "data")
    if dtype == "<U3":
        bad = np.array([["abc"] * 4] * 20, dtype="<U3")
    else:
        bad = x.astype(dtype)
    np.save(work / "data" / "x_dtype.npy", bad)
    expect_bad(run_case(work, spec_npy(x="x_dtype.npy")), "x_dtype.npy", "data")


def test_npy_float_labels_for_cross_entropy(work):
    _, y = good_data(work / "data")
    np.save(work / "data" / "y_float.npy", y.astype(np.float32))
    expect_bad(run_case(work, spec_npy(y="y_float.npy")), "y_float.npy", "data")


def test_npy_x_wrong_width(work):
    x, _ = good_data(work / "data")
    np.save(work / "data" / "x_wide.npy", np.concatenate([x, x[:, :1]], axis=1))
    expect_bad(run_case(work, spec_npy(x="x_wide.npy")), "x_wide.npy", "data")


def test_y_wrong_length(work):
    _, y = good_data(work / "data")
    np.save(work / "data" / "y_short.npy", y[:-1])
    expect_bad(run_case(work, spec_npy(y="y_short.npy")), "y_short.npy", "data")


def test_label_out_of_range(work):
    _, y = good_data(work / "data")
    y = y.copy()
    y[5] = 3  # model has 3 classes: 0..2
    np.save(work / "data" / "y_range.npy", y)
    expect_bad(run_case(work, spec_npy(y="y_range.npy")), "y_range.npy", "data")


def test_missing_file(work):
    good_data(work / "data")
    expect_bad(run_case(work, spec_npy(x="no_such_file.npy")), "no_such_file.npy")


def csv_spec(path):
    s = spec_npy()
    s["data"] = {"type": "csv", "path": path, "target": "target", "shuffle": False}
    return s


def test_csv_text_cell(work):
    data = work / "data"
    data.mkdir(parents=True)
    rows = ["f0,f1,f2,f3,target"] + [f"{i}.5,1,2,3,{i % 3}" for i in range(10)]
    rows[4] = "3.5,1,hello,3,0"
    (data / "bad_cell.csv").write_text("\n".join(rows) + "\n")
    expect_bad(run_case(work, csv_spec("bad_cell.csv")), "bad_cell.csv", "data")


def test_csv_ragged_row(work):
    data = work / "data"
    data.mkdir(parents=True)
    rows = ["f0,f1,f2,f3,target"] + [f"{i}.5,1,2,3,{i % 3}" for i in range(10)]
    rows[6] = "3.5,1,2,0"
    (data / "ragged.csv").write_text("\n".join(rows) + "\n")
    expect_bad(run_case(work, csv_spec("ragged.csv")), "ragged.csv", "data")


def test_csv_missing_target_column(work):
    data = work / "data"
    data.mkdir(parents=True)
    rows = ["f0,f1,f2,f3,label"] + [f"{i}.5,1,2,3,{i % 3}" for i in range(10)]
    (data / "notarget.csv").write_text("\n".join(rows) + "\n")
    run = run_case(work, csv_spec("notarget.csv"))
    expect_bad(run, "notarget.csv")


@pytest.mark.parametrize("cell,header,words", [
    ("-inf", "f0,f1,f2,f3,target", 'line 4, column 2 ("f1"): "-inf" is not a finite number'),
    ("NaN", "f0,f1,f2,f3,target", 'line 4, column 2 ("f1"): "NaN" is not a finite number'),
    ("1", "f0,f1,f2,f1,target", 'line 1 (the header): columns 2 and 4 are both named "f1"'),
], ids=["inf", "nan", "repeated-header"])
def test_csv_rank_file_checked_at_load(work, cell, header, words):
    """issue 28: the planner cannot read {rank} files; the rank that loads its own file
    makes the same checks (cells that are not finite, repeated header names) and ends with
    exit code 2 and a data error naming the file, the line and the column, before a step."""
    data = work / "data"
    data.mkdir(parents=True)
    rows = [header] + [f"{i}.5,1,2,3,{i % 3}" for i in range(10)]
    rows[3] = f"2.5,{cell},2,3,0"
    (data / "d_0.csv").write_text("\n".join(rows) + "\n")
    run = run_case(work, csv_spec("d_{rank}.csv"))
    expect_bad(run, "d_0.csv", "data")
    assert any(words in e["message"] for e in run.of("error")), run.describe()
    assert not run.of("loss")


def expect_spec_error(run, path_words):
    """exit code 2 and the JSON path named on stdout (error event) or stderr."""
    assert run.rc == 2, f"want exit code 2\n{run.describe()}"
    text = run.stdout + run.stderr
    for w in path_words:
        assert w in text, f"the error does not name {w!r}\n{run.describe()}"
    for m in CRASH_MARKS:
        assert m not in text, f"crash marker {m!r}\n{run.describe()}"
    assert not run.of("done") and not run.of("loss")
    return run


def test_spec_unknown_top_level_key(work):
    good_data(work / "data")
    s = spec_npy()
    s["batchsize"] = 4
    expect_spec_error(run_case(work, s), ["batchsize"])


def test_spec_unknown_nested_key(work):
    good_data(work / "data")
    s = spec_npy()
    s["optimizer"]["momentun"] = 0.9
    expect_spec_error(run_case(work, s), ["optimizer", "momentun"])


def test_spec_shapes_do_not_chain(work):
    good_data(work / "data")
    s = spec_npy()
    s["model"] = [{"type": "linear", "in": 4, "out": 6}, {"type": "relu"}, {"type": "linear", "in": 5, "out": 3}]
    expect_spec_error(run_case(work, s), ["model[2].in"])


def test_spec_not_json(work):
    good_data(work / "data")
    run = h.run_ddpd(None, work / "data", work / "out", raw_spec='{"name": "x", "model": [}', timeout=60)
    assert run.rc == 2, run.describe()
    assert not any(m in run.stdout + run.stderr for m in CRASH_MARKS), run.describe()


def test_path_leaving_data_dir(work):
    good_data(work / "data")
    np.save(work / "outside.npy", np.zeros((20, 4), np.float32))
    run = run_case(work, spec_npy(x="../outside.npy"))
    expect_spec_error(run, ["data.x"])


# ---------------------------------------------------------------------------------------
# memory (issue 15, item 9): a rank whose allocation fails ends with exit 4 and an error
# naming the tensor and its size; a job over the memory limit is refused before any rank.

BIG = [{"type": "linear", "in": 16384, "out": 16384}]  # 268M parameters: 1 GiB of float32


def worker_path():
    return h.ddpd_path().parent / "ddpd-worker"


def limited_worker(work, kib):
    """A DDPD_WORKER wrapper that runs ddpd-worker under `ulimit -v kib` (RLIMIT_AS)."""
    w = work / "limited-worker.sh"
    w.write_text(f"#!/bin/sh\nulimit -v {kib}\nexec {worker_path()} \"$@\"\n")
    w.chmod(0o755)
    return w


def run_env(work, spec, extra=(), env=None):
    import json
    import os
    import subprocess
    (work / "spec.json").write_text(json.dumps(spec))
    cmd = [str(h.ddpd_path()), "run", "--world-size", "1", "--out", str(work / "out"), "--data-dir",
           str(work / "data")] + list(extra) + [str(work / "spec.json")]
    e = h.ddpd_env()
    e.update(env or {})
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=e, cwd=str(work))
    return h.Run(p, work / "out", cmd)


def big_spec(data):
    return {"name": "big", "model": BIG, "loss": "mse", "optimizer": {"type": "sgd", "lr": 0.1},
            "data": data, "batch_size": 2, "epochs": 1}


@pytest.mark.parametrize("data,tensor", [
    ("npy", "cannot allocate the parameters (268451840 floats, 1073807360 bytes"),
    ("synthetic", "cannot allocate the synthetic teacher's layer 0 (268435456 doubles"),
])
def test_allocation_failure_in_a_rank_is_exit_4_naming_the_tensor(work, data, tensor):
    if b"__asan_init" in worker_path().read_bytes():
        pytest.skip("RLIMIT_AS cannot be combined with AddressSanitizer's shadow memory")
    d = work / "data"
    d.mkdir(parents=True, exist_ok=True)
    np.save(d / "x.npy", np.zeros((2, 16384), np.float32))
    np.save(d / "y.npy", np.zeros((2, 16384), np.float32))
    spec = big_spec({"type": "npy", "x": "x.npy", "y": "y.npy"} if data == "npy"
                    else {"type": "synthetic", "samples": 4})
    run = run_env(work, spec, env={"DDPD_WORKER": str(limited_worker(work, 1 << 20))})
    assert run.rc == 4, f"want exit code 4 (device: out of memory)\n{run.describe()}"
    errs = run.of("error")
    assert errs and errs[0]["kind"] == "device", run.describe()
    assert "out of memory" in errs[0]["message"] and tensor in errs[0]["message"], errs
    for m in CRASH_MARKS:
        assert m not in run.stdout + run.stderr + run.log_text(), f"crash marker {m!r}\n{run.describe()}"


def test_job_over_the_memory_limit_is_refused_before_the_ranks(work):
    d = work / "data"
    d.mkdir(parents=True, exist_ok=True)
    np.save(d / "x.npy", np.zeros((2, 16384), np.float32))
    np.save(d / "y.npy", np.zeros((2, 16384), np.float32))
    run = run_env(work, big_spec({"type": "npy", "x": "x.npy", "y": "y.npy"}), extra=["--max-rank-memory", "512M"])
    assert run.rc == 2, run.describe()
    msg = run.of("error")[0]["message"]
    assert "the job needs about 3.0 GiB" in msg and "parameters 1.0 GiB" in msg and "512.0 MiB" in msg, msg
    assert not (work / "out" / "rank-0.log").exists() or "training" not in run.log_text(), run.describe()
    run = run_env(work, big_spec({"type": "npy", "x": "x.npy", "y": "y.npy"}), extra=["--max-rank-memory", "bad"])
    assert run.rc == 2 and "--max-rank-memory" in run.stderr, run.describe()


def test_rank_killed_by_sigkill_from_outside_names_the_likely_oom_killer(work):
    """`ddpd run`: a rank that dies of a SIGKILL ddpd did not send (here its own, standing
    in for the kernel's OOM killer) is reported with the memory the job needed."""
    d = work / "data"
    d.mkdir(parents=True, exist_ok=True)
    w = work / "killed-worker.sh"
    # The planner (--plan) runs normally; a rank (no arguments) is killed at once.
    w.write_text(f'#!/bin/sh\n[ $# -gt 0 ] && exec {worker_path()} "$@"\nkill -9 $$\n')
    w.chmod(0o755)
    spec = {"name": "k", "model": [{"type": "linear", "in": 1000, "out": 1000}], "loss": "mse",
            "optimizer": {"type": "sgd", "lr": 0.1}, "data": {"type": "synthetic", "samples": 100},
            "batch_size": 10, "epochs": 1}
    run = run_env(work, spec, env={"DDPD_WORKER": str(w)})
    assert run.rc != 0, run.describe()
    assert "killed by signal 9" in run.stderr and "likely the out-of-memory killer" in run.stderr, run.describe()
    assert "the job needed about 2" in run.stderr, run.describe()  # 3 x 4 MB of weights + the teacher's 8 MB
