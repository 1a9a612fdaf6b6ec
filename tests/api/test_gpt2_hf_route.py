"""test_gpt2_hf_route.py — Hugging Face GPT-2 in and out through a real server (issue 30):
init.format "gpt2" checked at submit, GET /v1/jobs/{id}/checkpoint?format=gpt2 (and
&file=config, and step=) and `ddpd pull --format gpt2 ID DIR`.

- A job fine-tuned from a tiny GPT-2 that the test writes in Hugging Face's layout
  (pylib.hf_gpt2) is exported: the file reloads strictly into the hand-written Hugging Face
  module and gives the logits of ddpd's own weights in ddpd's module (pylib.torch_models);
  its tensors are ddpd's, transposed where Conv1D keeps [in, out], bit for bit, with no
  lm_head copy of a tied wte; config.json's fields are the spec's. `ddpd pull --format gpt2`
  writes the same two files. A step's checkpoint exports its own weights.
- A model that is not GPT-2-shaped: 409 on both files saying why, and pull fails naming it
  with nothing written.
- Every mismatch of the file with the spec is a 422 at submit naming the tensor, its shape
  in the file and the shape the spec needs: n_embd in config.json, a missing tensor, a
  Conv1D weight not transposed, an unknown dtype, no config.json, bad JSON in it; a spec
  that is not GPT-2-shaped names the layer. A tied lm_head in the file that differs from wte
  fails the job naming both."""
import json
import os
import subprocess

import numpy as np
import pytest

from pylib import hf_gpt2 as hf
from pylib.common import bin_dir
from pylib.safetensors import st_decode, st_encode
from pylib.server import seed_spec

FINAL = ("succeeded", "failed", "cancelled")
CFG = dict(n_layer=2, n_head=2, n_embd=16, vocab_size=37, n_positions=8)


def err_of(r, status):
    assert r.status_code == status, f"expected {status}, got {r.status_code}: {r.text[:600]}"
    return r.json()["error"]


def job(server, cfg=None, steps=4, tie=True, every=None, seed=1, **save_kw):
    """Hugging Face's files and a tokens file in the server's data folder; the spec."""
    cfg = cfg or hf.config(**CFG)
    d = server.data_dir
    sd = hf.random_state(cfg, seed)
    hf.save(d / "gpt2", sd, cfg, **save_kw)
    T = cfg["n_positions"]
    ids = np.random.default_rng(seed).integers(0, cfg["vocab_size"], size=8 * T + 1).astype(np.uint16)
    ids.tofile(d / "tok.bin")
    spec = {"name": "gpt2-hf", "device": "cpu", "world_size": 1, "model": hf.spec_model(cfg, tie),
            "input_shape": [T], "loss": "cross_entropy", "optimizer": {"type": "adamw", "lr": 0.01},
            "batch_size": 2, "steps": steps, "log_every": 1,
            "data": {"type": "tokens", "path": "tok.bin", "block_size": T, "shuffle": False},
            "init": {"from": "gpt2/model.safetensors", "format": "gpt2"}}
    if every:
        spec["checkpoint"] = {"every_steps": every}
    return spec, sd, cfg


def pull(server, *args):
    e = dict(os.environ, DDPD_SERVER=server.url)
    e.pop("DDPD_TOKEN", None)
    return subprocess.run([str(bin_dir() / "ddpd"), "pull", *args], env=e, capture_output=True, text=True,
                          timeout=120)


def ddpd_logits(model, own, ids):
    """Logits of ddpd's weights `own` in ddpd's own module tree."""
    import torch
    from pylib import torch_models
    m = torch_models.build(model)
    m.load_state_dict({k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in own.items()}, strict=True)
    with torch.no_grad():
        return m.eval()(torch.from_numpy(np.asarray(ids, np.int64))).double().numpy()


def check_export(raw, own, spec, cfg):
    """The exported bytes against ddpd's own weights: names, layout, logits."""
    tensors, meta = st_decode(raw, strict=True)
    assert meta == {"format": "pt"}, meta
    assert all(k.startswith("transformer.") for k in tensors), sorted(tensors)
    assert "lm_head.weight" not in tensors, "a tied lm_head is left out, as Hugging Face's files leave it"
    assert len(tensors) == 2 + 12 * cfg["n_layer"] + 2, sorted(tensors)
    exported = {k[len("transformer."):]: v for k, v in tensors.items()}
    back = hf.to_ddpd(exported, cfg)
    assert sorted(back) == sorted(own), (sorted(back), sorted(own))
    for k in own:
        assert np.array_equal(back[k], own[k]), f"{k}: the export is not ddpd's weight (transposed where Conv1D)"
    ids = np.random.default_rng(9).integers(0, cfg["vocab_size"], size=(3, cfg["n_positions"]))
    got, want = hf.logits(exported, cfg, ids), ddpd_logits(spec["model"], own, ids)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5), np.max(np.abs(got - want))


def test_export_route_and_pull_reload_with_equal_logits(server, work):
    spec, sd, cfg = job(server, every=2)
    jid = server.submit(spec)["id"]
    j = server.wait_state(jid, FINAL)
    assert j["state"] == "succeeded", j["error"]
    assert j["spec"]["init"] == {"from": "gpt2/model.safetensors", "format": "gpt2"}, j["spec"]["init"]
    own = st_decode(server.get(f"/v1/jobs/{jid}/checkpoint").content)[0]
    assert not np.array_equal(own["0.weight"], sd["wte.weight"]), "fine-tuned: the weights moved"

    r = server.get(f"/v1/jobs/{jid}/checkpoint?format=gpt2")
    assert r.status_code == 200, r.text
    assert r.headers["Content-Disposition"] == 'attachment; filename="model.safetensors"', r.headers
    assert int(r.headers["Content-Length"]) == len(r.content)
    check_export(r.content, own, spec, cfg)

    c = server.get(f"/v1/jobs/{jid}/checkpoint?format=gpt2&file=config")
    assert c.status_code == 200 and c.headers["Content-Type"].startswith("application/json"), c.text
    conf = c.json()
    want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "activation_function": "gelu_new",
            "n_layer": 2, "n_head": 2, "n_embd": 16, "vocab_size": 37, "n_positions": 8, "n_ctx": 8,
            "layer_norm_epsilon": 1e-5, "n_inner": None, "tie_word_embeddings": True, "embd_pdrop": 0.0,
            "resid_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": 36, "eos_token_id": 36,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False}
    assert {k: conf.get(k) for k in want} == want, conf

    # A step's checkpoint: its own weights.
    r2 = server.get(f"/v1/jobs/{jid}/checkpoint?format=gpt2&step=2")
    assert r2.status_code == 200, r2.text
    own2 = st_decode(server.get(f"/v1/jobs/{jid}/checkpoint?step=2").content)[0]
    check_export(r2.content, own2, spec, cfg)
    assert r2.content != r.content
    e = err_of(server.get(f"/v1/jobs/{jid}/checkpoint?format=gpt2&step=3"), 404)
    assert e["path"] == "step", e

    out = work / "hf-out"
    p = pull(server, "--format", "gpt2", str(jid), str(out))
    assert p.returncode == 0, p.stderr
    assert "from_pretrained" in p.stderr, p.stderr
    assert sorted(x.name for x in out.iterdir()) == ["config.json", "model.safetensors"]
    assert (out / "model.safetensors").read_bytes() == r.content
    assert json.loads((out / "config.json").read_text()) == conf
    # What from_pretrained(DIR) does: config.json builds the module, the file loads strictly.
    loaded = hf.load(out / "model.safetensors")
    hf.module_from(loaded, json.loads((out / "config.json").read_text()))
    p = pull(server, "--format", "gpt2", "--step", "2", str(jid), str(work / "hf-2"))
    assert p.returncode == 0, p.stderr
    assert (work / "hf-2" / "model.safetensors").read_bytes() == r2.content


def test_query_mistakes_are_400(server):
    jid = server.submit(seed_spec())["id"]
    for q, name in (("file=config", "file"), ("format=gpt2&file=optim", "file"), ("format=onnx", "format")):
        e = err_of(server.get(f"/v1/jobs/{jid}/checkpoint?{q}"), 400)
        assert e["code"] == "bad_query" and name in e["message"], (q, e)


def test_a_model_that_is_not_gpt2_is_409_and_pull_fails(server, work):
    jid = server.submit(seed_spec())["id"]
    assert server.wait_state(jid, FINAL)["state"] == "succeeded"
    for q in ("format=gpt2", "format=gpt2&file=config"):
        e = err_of(server.get(f"/v1/jobs/{jid}/checkpoint?{q}"), 409)
        assert e["code"] == "conflict" and e["path"] == "format", e
        assert e["message"] == (f"job {jid}'s model is not GPT-2-shaped, so it has no Hugging Face GPT-2 form: "
                                "model[0] is a linear where GPT-2 has an embedding (wte)"), e
    out = work / "nope"
    p = pull(server, "--format", "gpt2", str(jid), str(out))
    assert p.returncode != 0 and "not GPT-2-shaped" in p.stderr, (p.returncode, p.stderr)
    assert not out.exists(), "nothing written"
    p = pull(server, "--format", "onnx", str(jid), str(out))
    assert p.returncode == 2 and "--format: expected gpt2" in p.stderr, p.stderr


def refused(server, spec, path="init.from"):
    e = err_of(server.post("/v1/jobs", json=spec), 422)
    assert e["path"] == path, e
    return e["message"]


def test_mismatches_are_422_at_submit_naming_tensor_and_shapes(server):
    cfg = hf.config(**CFG)
    # n_embd in config.json
    spec, sd, _ = job(server, cfg_text=json.dumps(dict(cfg, n_embd=32)))
    assert refused(server, spec) == ("init.from: gpt2/config.json: n_embd is 32 but the spec's model has 16 dim")
    # no config.json, bad JSON in it
    (server.data_dir / "gpt2" / "config.json").unlink()
    m = refused(server, spec)
    assert m.startswith("init.from: init.format \"gpt2\" reads the config.json beside gpt2/model.safetensors "
                        "(gpt2/config.json)"), m
    (server.data_dir / "gpt2" / "config.json").write_text('{\n  "n_layer": 2,\n  "n_head": 2,,\n}')
    m = refused(server, spec)
    assert m.startswith("init.from: gpt2/config.json: line 3: "), m
    # a tensor missing
    hf.save(server.data_dir / "gpt2", {k: v for k, v in sd.items() if k != "h.1.mlp.c_fc.bias"}, cfg)
    assert refused(server, spec) == ('init.from: gpt2/model.safetensors has no tensor "h.1.mlp.c_fc.bias" '
                                     "(the spec needs [64] for model[6].layers[1], ddpd's \"6.1.bias\")")
    # a Conv1D weight in ddpd's [out, in] instead of [in, out]
    bad = dict(sd)
    bad["h.0.attn.c_attn.weight"] = sd["h.0.attn.c_attn.weight"].T.copy()
    hf.save(server.data_dir / "gpt2", bad, cfg)
    assert refused(server, spec) == (
        'init.from: gpt2/model.safetensors: tensor "transformer.h.0.attn.c_attn.weight" has shape [48, 16] in the '
        "file; the spec needs [16, 48] (model[3].layers[1], ddpd's \"3.1.qkv.weight\", a Conv1D weight stored "
        "[in, out])")
    # a dtype ddpd does not read
    bad = dict(sd)
    bad["h.0.ln_1.bias"] = np.zeros(16, np.int32)
    hf.save(server.data_dir / "gpt2", bad, cfg)
    m = refused(server, spec)
    assert 'tensor "transformer.h.0.ln_1.bias": dtype "I32" is not supported' in m, m
    # a tensor GPT-2 of this size has no place for
    hf.save(server.data_dir / "gpt2", dict(sd, **{"h.2.ln_1.bias": sd["h.0.ln_1.bias"]}), cfg)
    assert refused(server, spec) == ('init.from: gpt2/model.safetensors: tensor "transformer.h.2.ln_1.bias" has '
                                     "no place in the spec's GPT-2 (2 blocks)")
    # F16 is converted, and the file is then fine
    hf.save(server.data_dir / "gpt2", {k: v.astype(np.float16) for k, v in sd.items()}, cfg)
    server.submit(spec)


def test_a_spec_that_is_not_gpt2_shaped_is_422_at_the_layer(server):
    spec, _, _ = job(server)
    spec["model"][-1]["bias"] = True
    assert refused(server, spec, "model[8]") == ('init.format "gpt2" reads a Hugging Face GPT-2, but model[8] '
                                                 '(lm_head) has a bias; GPT-2\'s has none ("bias": false)')
    spec, _, _ = job(server)
    spec["model"][5]["layers"][1]["heads"] = 4
    assert refused(server, spec, "model[5].layers[1]") == (
        'init.format "gpt2" reads a Hugging Face GPT-2, but model[5].layers[1] (h.1.attn) has 4 heads but block '
        "0's has 2 (GPT-2 has one n_head)")
    spec, _, _ = job(server)
    spec["init"] = {"from_job": 1, "format": "gpt2"}
    assert "goes with init.from" in refused(server, spec, "init.format")


def test_a_tied_lm_head_that_differs_from_wte_fails_the_job(server):
    spec, sd, cfg = job(server)
    raw = st_encode(dict({"transformer." + k: v for k, v in sd.items()},
                         **{"lm_head.weight": sd["wte.weight"] + np.float32(0.5)}))
    (server.data_dir / "gpt2" / "model.safetensors").write_bytes(raw)
    jid = server.submit(spec)["id"]
    j = server.wait_state(jid, FINAL)
    assert j["state"] == "failed", j
    assert '"lm_head.weight" and "transformer.wte.weight" differ at [0, 0]' in j["error"], j["error"]
