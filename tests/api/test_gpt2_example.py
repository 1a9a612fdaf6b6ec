"""test_gpt2_example.py — examples/gpt2-finetune.json and docs/gpt2.md's flow, end to end
through a real server, on a tiny GPT-2 instead of Hugging Face's 124M one (whose files
cannot be downloaded here): the test writes the three files as Hugging Face publishes them
(model.safetensors in their layout with the mask buffers, config.json; vocab.json and
merges.txt, a vocabulary learned from the text by pylib.bpe), then does what the page says:
`ddpd tokenize` the text into train.bin and eval.bin, submit the example with only the
preset's sizes and the step counts made small, watch it succeed (eval included), `ddpd
generate` with text, and `ddpd pull --format gpt2` into a folder whose files load strictly
into the hand-written Hugging Face module with the logits of the job's own weights."""
import json
import os
import subprocess

import numpy as np
import pytest

from pylib import bpe
from pylib import hf_gpt2 as hf
from pylib.common import REPO, bin_dir
from pylib.infer_api import real_worker
from pylib.safetensors import st_decode

TEXT = ("First Citizen: Before we proceed any further, hear me speak. All: Speak, speak. "
        "First Citizen: You are all resolved rather to die than to famish? All: Resolved. resolved.\n") * 30


def ddpd(server, *args, timeout=120):
    e = dict(os.environ, DDPD_SERVER=server.url)
    e.pop("DDPD_TOKEN", None)
    r = subprocess.run([str(bin_dir() / "ddpd"), *args], env=e, capture_output=True, text=True, timeout=timeout,
                       cwd=str(server.data_dir))
    assert r.returncode == 0, f"ddpd {' '.join(args)}: exit {r.returncode}\n{r.stderr}"
    return r


def test_the_gpt2_finetune_example_on_a_tiny_gpt2(make_server, work):
    if not real_worker():
        pytest.skip("the real ddpd-worker --infer is needed for generate")
    server = make_server()
    d = server.data_dir
    # The three downloads of docs/gpt2.md, made small: vocab.json and merges.txt ...
    (d / "gpt2").mkdir()
    vocab, merges = bpe.train(TEXT, 30)
    bpe.write(d / "gpt2", vocab, merges)
    # ... and model.safetensors + config.json of a GPT-2 whose vocabulary is that one.
    cfg = hf.config(n_layer=2, n_head=2, n_embd=16, vocab_size=len(vocab), n_positions=16)
    hf.save(d / "gpt2", hf.random_state(cfg, 3), cfg, prefix=False, mask=True)
    (d / "input.txt").write_text(TEXT)

    ddpd(server, "tokenize", "--vocab", "gpt2/vocab.json", "--merges", "gpt2/merges.txt", "-o", "gpt2/train.bin",
         "--eval-fraction", "0.1", "input.txt")
    ids = np.fromfile(d / "gpt2" / "train.bin", dtype=np.uint16)
    assert ids.size > 100 and ids.max() < len(vocab), ids.size

    spec = json.loads((REPO / "examples" / "gpt2-finetune.json").read_text())
    spec["model"].update(layers=cfg["n_layer"], dim=cfg["n_embd"], heads=cfg["n_head"], vocab=cfg["vocab_size"],
                         block_size=cfg["n_positions"])
    for data in (spec["data"], spec["eval"]["data"]):
        data["block_size"] = cfg["n_positions"]
    spec.update(device="cpu", steps=6, grad_accum=2, log_every=1)
    spec["checkpoint"]["every_steps"] = 3
    spec["eval"]["every_steps"] = 3
    jid = server.submit(spec)["id"]
    j = server.wait_state(jid, ("succeeded", "failed", "cancelled"), timeout=180)
    assert j["state"] == "succeeded", j["error"]
    evals = [e for e in server.events(jid, timeout=30) if e.get("event") == "eval"]
    assert evals, "eval ran"

    g = ddpd(server, "generate", "-n", "8", "--seed", "1", str(jid), "First Citizen:", timeout=180)
    assert "8 tokens" in g.stderr and g.stdout.strip(), (g.stdout, g.stderr)
    prompt = [int(i) for i in ids[:5]]
    r = server.post(f"/v1/jobs/{jid}/generate", json={"ids": prompt, "max_new_tokens": 4, "temperature": 0},
                    timeout=120)
    assert r.status_code == 200, r.text
    got = r.json()["ids"]

    out = work / "gpt2-out"
    ddpd(server, "pull", "--format", "gpt2", str(jid), str(out))
    conf = json.loads((out / "config.json").read_text())
    assert {k: conf[k] for k in ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions")} == \
        {k: cfg[k] for k in ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions")}, conf
    exported = hf.load(out / "model.safetensors")
    own = st_decode(server.get(f"/v1/jobs/{jid}/checkpoint").content)[0]
    for k, v in hf.to_ddpd(exported, conf).items():
        assert np.array_equal(v, own[k]), k
    # generate's greedy continuation is the exported model's argmax, token by token.
    seq = list(prompt)
    for _ in range(4):
        seq.append(int(np.argmax(hf.logits(exported, conf, np.array([seq]))[0, -1])))
    assert got == seq[-4:], (got, seq)
