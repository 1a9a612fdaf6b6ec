"""test_tokenizer_api.py — a job's `tokenizer` (GPT-2's vocab.json and merges.txt) through a
real server and the real inference worker: checked at submit by the planner (a merges file
with a bad line, a vocabulary wider than the embedding, a path outside the data folder: 422
naming the field and the line), printed back in the job's spec, and then generate takes
text and answers text: the prompt encoded with the BPE (as pylib.bpe's reference encodes
it), the answer's text the bytes of its ids, streamed token by token and whole. The
vocabulary is learned by the test from a text it writes."""
import json

import numpy as np
import pytest

from pylib import bpe
from pylib.infer_api import real_worker, stream_lines
from pylib.server import seed_spec

TEXT = ("First Citizen: Before we proceed any further, hear me speak. All: Speak, speak. "
        "First Citizen: You are all resolved rather to die than to famish? Ünïcödé, café — 你好 🎉\n") * 12
VOCAB = 320  # the embedding's num: wider than the 256 + merges the test learns


def gpt_spec(num=VOCAB, T=8, tokenizer=None, data="train.bin"):
    model = [{"type": "embedding", "num": num, "dim": 16}, {"type": "position", "max": T, "dim": 16},
             {"type": "residual", "layers": [{"type": "layernorm", "dim": 16},
                                             {"type": "attention", "dim": 16, "heads": 2, "causal": True}]},
             {"type": "layernorm", "dim": 16}, {"type": "linear", "in": 16, "out": num}]
    s = seed_spec(name="bpe-gpt", model=model, input_shape=[T], loss="cross_entropy", epochs=None, steps=4,
                  optimizer={"type": "adamw", "lr": 0.01}, batch_size=4, log_every=1,
                  data={"type": "tokens", "path": data, "block_size": T, "seed": 1})
    s["tokenizer"] = tokenizer or {"vocab": "gpt2/vocab.json", "merges": "gpt2/merges.txt"}
    return s


@pytest.fixture
def tok_server(make_server):
    if not real_worker():
        pytest.skip("the real ddpd-worker --infer is needed")
    srv = make_server()
    folder = srv.data_dir / "gpt2"
    folder.mkdir()
    vocab, merges = bpe.train(TEXT, 40)
    bpe.write(folder, vocab, merges)
    enc = bpe.Encoder(vocab, merges)
    np.array(enc.encode(TEXT), dtype=np.uint16).tofile(srv.data_dir / "train.bin")
    return srv, enc, folder


def test_generate_takes_and_gives_text_with_the_jobs_tokenizer(tok_server):
    srv, enc, _ = tok_server
    jid = srv.submit(gpt_spec())["id"]
    j = srv.wait_state(jid, ("succeeded", "failed", "cancelled"), timeout=180)
    assert j["state"] == "succeeded", j
    assert j["spec"]["tokenizer"] == {"vocab": "gpt2/vocab.json", "merges": "gpt2/merges.txt"}, j["spec"]

    prompt = "First Citizen: café 你好"
    r = srv.post(f"/v1/jobs/{jid}/generate", json={"prompt": prompt, "max_new_tokens": 24, "seed": 3},
                 timeout=120)
    assert r.status_code == 200, r.text
    a = r.json()
    assert a["prompt_tokens"] == len(enc.encode(prompt)), (a, enc.encode(prompt))
    assert len(a["ids"]) == 24 and all(0 <= t < VOCAB for t in a["ids"]), a
    # The text is the ids' bytes (ids past the learned vocabulary have none), decoded as
    # UTF-8 with U+FFFD for what is not.
    known = [t for t in a["ids"] if t in enc.decoder]
    assert a["text"] == enc.decode(known).decode("utf-8", errors="replace"), a

    # Streamed: the tokens' texts add up to the whole, the same as unstreamed.
    r = srv.post(f"/v1/jobs/{jid}/generate", json={"prompt": prompt, "max_new_tokens": 24, "seed": 3,
                                                   "stream": True}, stream=True, timeout=120)
    assert r.status_code == 200, r.text
    lines = stream_lines(r)
    tokens, final = lines[:-1], lines[-1]
    assert [t["token"] for t in tokens] == a["ids"], lines
    assert "".join(t["text"] for t in tokens) == a["text"] == final["text"], lines

    # ids still work, and answer text too.
    r = srv.post(f"/v1/jobs/{jid}/generate", json={"ids": enc.encode("First"), "max_new_tokens": 4}, timeout=120)
    assert r.status_code == 200 and isinstance(r.json()["text"], str), r.text


def err_of(r, path, fragment):
    assert r.status_code == 422, (r.status_code, r.text)
    e = r.json()["error"]
    assert e["path"] == path and fragment in e["message"], e
    return e


def test_a_bad_tokenizer_is_a_422_at_submit_naming_the_field_and_line(tok_server):
    srv, _, folder = tok_server
    lines = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
    bad = lines[:3] + ["Ġ t h"] + lines[3:]
    (folder / "bad-merges.txt").write_text("\n".join(bad) + "\n", encoding="utf-8")
    r = srv.post("/v1/jobs", json=gpt_spec(tokenizer={"vocab": "gpt2/vocab.json",
                                                     "merges": "gpt2/bad-merges.txt"}))
    err_of(r, "tokenizer.merges", "gpt2/bad-merges.txt line 4: expected two tokens separated by one space")

    v = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    v["x"] = 1  # two tokens with id 1
    (folder / "bad-vocab.json").write_text(json.dumps(v), encoding="utf-8")
    r = srv.post("/v1/jobs", json=gpt_spec(tokenizer={"vocab": "gpt2/bad-vocab.json",
                                                     "merges": "gpt2/merges.txt"}))
    err_of(r, "tokenizer.vocab", "both have id 1")

    # A vocabulary (256 bytes and 40 merges) wider than the embedding (on ids it holds).
    np.arange(64, dtype=np.uint16).tofile(srv.data_dir / "small.bin")
    err_of(srv.post("/v1/jobs", json=gpt_spec(num=280, data="small.bin")), "tokenizer.vocab",
           "has 296 tokens, more than the 280 ids")
    # Paths are data paths; a model without an embedding cannot have one.
    err_of(srv.post("/v1/jobs", json=gpt_spec(tokenizer={"vocab": "../vocab.json", "merges": "m.txt"})),
           "tokenizer.vocab", "inside the data directory")
    err_of(srv.post("/v1/jobs", json=gpt_spec(tokenizer={"vocab": "gpt2/none.json",
                                                        "merges": "gpt2/merges.txt"})),
           "tokenizer.vocab", "gpt2/none.json")
    mlp = seed_spec(tokenizer={"vocab": "gpt2/vocab.json", "merges": "gpt2/merges.txt"})
    err_of(srv.post("/v1/jobs", json=mlp), "tokenizer", "reads token ids")
