"""test_tie.py — tied weights (issue 30): a `linear` with `"tie": "0"` uses the embedding's
[num, dim] table as its [out, in] weight, as nanoGPT's `lm_head.weight = wte.weight`.

Against PyTorch 1.13 DDP (gloo) on the same module tree (pylib.torch_models shares the
Parameter): the 2-block GPT of test_gpt.py with a tied head, at W = 1, 2 and 3, with
grad_accum 2 (no_sync) and, at W > 1, uneven per-rank files (join), for SGD with momentum
and AdamW: losses and final weights within the parity tolerances, the model file holding
the tied weight under both keys, equal, and loading with load_state_dict(strict=True).
The optimizer keeps one state for it. A resume from a checkpoint is bit-exact. A file
whose two copies differ, or that lacks the tied key, is refused naming the keys."""
from pathlib import Path

import numpy as np
import pytest
from test_gpt import OPTS, check, gpt, resume_on_rank_files, token_case

from pylib import ddp as H


@pytest.fixture(autouse=True)
def _skip_code(request):
    H.install_skip_code(request.config)


@pytest.fixture
def work(tmp_path):
    return H.workdir("tie-parity-") if H.os.environ.get("DDPD_TEST_TMP") else tmp_path


HEAD = "7"  # the tied head's key in gpt(blocks=2): embedding, position, 4 residuals, layernorm, head


def tied_case(world, opt, seed):
    """gpt(tie=True) on per-rank files of 12, 8 (and 4) samples (W = 1: 10 in one file),
    batches of 2, grad_accum 2: ranks run 3, 2 (and 1) steps, so W > 1 joins."""
    model = gpt(attn_bias=opt != "adamw", tie=True)
    sizes = {1: [10], 2: [12, 8], 3: [12, 8, 4]}[world]
    case = token_case(model, 32, 8, sum(sizes), 1, OPTS[opt], 2, grad_accum=2, seed=seed)
    if world > 1:
        x, y = case.full
        cuts = np.cumsum([0] + sizes)
        case = H.Case.per_rank(case.spec, [x[a:b] for a, b in zip(cuts, cuts[1:])],
                               [y[a:b] for a, b in zip(cuts, cuts[1:])], case.init_sd)
    return case


@pytest.mark.parametrize("opt", sorted(OPTS))
@pytest.mark.parametrize("world", [1, 2, 3])
def test_tied_gpt_ddp(work, world, opt):
    case = tied_case(world, opt, seed=40 + world)
    assert np.array_equal(case.init_sd["0.weight"], case.init_sd[HEAD + ".weight"]), "torch ties them"
    run = check(case, work)
    assert bool(run.of("join")) == (world > 1), "ranks with fewer steps join"
    got = run.model()
    assert np.array_equal(got["0.weight"], got[HEAD + ".weight"]), "the model file's two copies differ"
    assert HEAD + ".bias" not in got, "the head has no bias (bias false)"
    # One optimizer state for the shared tensor, at the embedding's name.
    optim = H.st_load(run.out / "optim.safetensors")
    assert any(k.startswith("0.weight.") for k in optim), sorted(optim)
    assert not any(k.startswith(HEAD + ".weight") for k in optim), sorted(optim)


def test_tied_resume_is_exact(work):
    """A checkpoint of a tied GPT on per-rank tokens files of different lengths (shuffled,
    join, 2 epochs, AdamW, grad_accum 2) resumes into exactly the uninterrupted run."""
    b = resume_on_rank_files(work, gpt(tie=True), seed=8).model()
    assert np.array_equal(b["0.weight"], b[HEAD + ".weight"])


def refused(work, change):
    """`ddpd run` of a tied GPT whose init.from file `change` edits: the run's output text,
    after asserting that it failed."""
    H.need_bin()
    case = token_case(gpt(tie=True), 32, 8, 4, 1, {"type": "sgd", "lr": 0.1}, 2, seed=1)
    change(case.init_sd)
    spec = case.write(Path(work) / "data")
    run = H.run_ddpd(spec, 1, work)
    assert run.rc != 0, run.describe()
    assert not run.of("loss"), "refused before training"
    return run.stdout + run.stderr


def test_init_from_without_the_tied_key(work):
    text = refused(work, lambda sd: sd.pop(HEAD + ".weight"))
    assert f'no tensor "{HEAD}.weight"' in text and f"of layer {HEAD}" in text, text[-2000:]


def test_init_from_with_unequal_copies(work):
    def change(sd):
        sd[HEAD + ".weight"] = sd[HEAD + ".weight"].copy()
        sd[HEAD + ".weight"][3, 1] += 0.5
    text = refused(work, change)
    assert f'"0.weight" and "{HEAD}.weight" differ' in text, text[-2000:]
