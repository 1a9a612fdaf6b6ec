"""test_tokenize.py — `ddpd tokenize` end to end with a vocabulary the test learns
(pylib/bpe.py's small trainer) on a long real text with non-ASCII characters (the repo's
docs, a multilingual paragraph and emoji): its ids equal the pure-Python reference
encoder's (OpenAI's encoder.py written with `re`), the whole text comes back from them
(decode(encode(t)) == t, also for bytes that are not UTF-8), a text of several of the
command's 1 MiB chunks (cut between them) gives the ids of the whole, --eval-fraction
splits the tokens, a vocabulary past 65536 tokens writes int32, and a malformed
vocab.json or merges.txt is exit code 2 naming the file and line."""
import json
import subprocess

import numpy as np
import pytest

from pylib import bpe
from pylib import parity as h
from pylib.common import REPO, bin_dir

PARAGRAPH = ("Ünïcödé façade — naïve café, smörgåsbord. Привет, мир! Γειά σου Κόσμε. 你好，世界。"
             "こんにちは世界 안녕하세요 مرحبا بالعالم שלום עולם नमस्ते दुनिया 🎉🚀👍🏽 I'm sure you'll "
             "see we've done it, they'd say. 3.14159 and 1,000,000\ttabs\r\nand\u00a0spaces    \n\n\n")


@pytest.fixture(autouse=True)
def _skip_code(request):
    h.install_skip_code(request.config)


@pytest.fixture
def work(request, tmp_path, _skip_code):
    yield from h.workdir(request, tmp_path, "e2e-tokenize-")


@pytest.fixture(scope="module")
def text():
    docs = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
    return "".join(p.read_text(encoding="utf-8") for p in docs) + PARAGRAPH * 20


@pytest.fixture(scope="module")
def learned(text):
    return bpe.train(text, 400, sample=150_000)


def ddpd():
    b = bin_dir()
    if not b:
        pytest.skip("ddpd is not built")
    return str(b / "ddpd")


def tokenize(work, vocab, merges, src, *extra):
    out = work / "train.bin"
    r = subprocess.run([ddpd(), "tokenize", "--vocab", str(vocab), "--merges", str(merges), "-o", str(out),
                        *map(str, extra), str(src)], capture_output=True, text=True, timeout=300)
    return r, out


def test_ids_match_the_reference_and_come_back_as_the_text(work, text, learned):
    vocab, merges = learned
    v, m = bpe.write(work, vocab, merges)
    src = work / "in.txt"
    src.write_text(text, encoding="utf-8")
    r, out = tokenize(work, v, m, src)
    assert r.returncode == 0, r.stderr
    ids = np.fromfile(out, dtype=np.uint16).tolist()
    enc = bpe.Encoder(vocab, merges)
    assert ids == enc.encode(text)
    assert enc.decode(ids) == text.encode("utf-8")
    assert len(ids) < len(text.encode("utf-8")) * 0.6, "the merges shorten the text"
    assert f"{len(text.encode('utf-8'))} bytes -> {len(ids)} tokens (uint16, data.dtype \"uint16\"" in r.stdout


def test_chunks_cut_where_the_whole_gives_the_same_ids(work, text, learned):
    vocab, merges = learned
    v, m = bpe.write(work, vocab, merges)
    # About 3 MiB: three chunks and more, read from stdin; plus bytes that are not UTF-8,
    # which the reference cannot take (they are checked by the round trip).
    big = (text * (3 * 2 ** 20 // len(text.encode("utf-8")) + 1)).encode("utf-8")
    raw = big + b"tail \xff\xfe\xc3( bytes"
    src = work / "big.txt"
    src.write_bytes(raw)
    r = subprocess.run([ddpd(), "tokenize", "--vocab", str(v), "--merges", str(m), "-o", str(work / "big.bin"),
                        "-"], stdin=open(src, "rb"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ids = np.fromfile(work / "big.bin", dtype=np.uint16).tolist()
    enc = bpe.Encoder(vocab, merges)
    assert enc.decode(ids) == raw
    one = enc.encode(text)
    n = len(big) // len(text.encode("utf-8"))
    assert ids[:len(one) * n] == one * n


def test_eval_fraction_splits_the_tokens(work, text, learned):
    vocab, merges = learned
    v, m = bpe.write(work, vocab, merges)
    src = work / "in.txt"
    src.write_text(text, encoding="utf-8")
    r, out = tokenize(work, v, m, src, "--eval-fraction", "0.1")
    assert r.returncode == 0, r.stderr
    train = np.fromfile(out, dtype=np.uint16).tolist()
    ev = np.fromfile(work / "eval.bin", dtype=np.uint16).tolist()
    whole = bpe.Encoder(vocab, merges).encode(text)
    assert train + ev == whole and len(ev) == int(len(whole) * 0.1), (len(train), len(ev))
    r, _ = tokenize(work, v, m, src, "--eval-fraction", "0.5", "--eval-out", work / "held.bin")
    assert r.returncode == 0 and (work / "held.bin").stat().st_size == 2 * int(len(whole) * 0.5), r.stderr
    r, _ = tokenize(work, v, m, src, "--eval-fraction", "1.5")
    assert r.returncode == 2 and "--eval-fraction: expected a number between 0 and 1" in r.stderr, r.stderr


def test_a_vocabulary_past_65536_tokens_writes_int32(work):
    wide = {bpe.B2U[b]: b for b in range(256)}
    for i in range(70000):  # tokens no merge makes: only their ids matter
        wide["Ā" * 3 + bpe.to_alpha(i.to_bytes(3, "big"))] = len(wide)
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o")]
    for a, b in merges:
        wide[a + b] = len(wide)
    v, m = bpe.write(work, wide, merges)
    src = work / "in.txt"
    src.write_text("hello world, hello", encoding="utf-8")
    r, out = tokenize(work, v, m, src)
    assert r.returncode == 0 and "(int32, data.dtype \"int32\"" in r.stdout, r.stdout + r.stderr
    ids = np.fromfile(out, dtype=np.int32).tolist()
    assert ids[0] == wide["hello"] == ids[-1] and ids[0] > 65535, ids
    assert bpe.Encoder(wide, merges).encode("hello world, hello") == ids


def test_malformed_files_name_the_file_and_line(work, learned):
    vocab, merges = learned
    v, m = bpe.write(work, vocab, merges)
    src = work / "in.txt"
    src.write_text("hello", encoding="utf-8")
    lines = m.read_text(encoding="utf-8").splitlines()
    bad = work / "bad-merges.txt"
    bad.write_text("\n".join(lines[:5] + ["a b c"] + lines[5:]) + "\n", encoding="utf-8")
    r, out = tokenize(work, v, bad, src)
    assert r.returncode == 2 and f"{bad} line 6: expected two tokens separated by one space" in r.stderr, r.stderr
    assert not out.exists()
    badv = work / "bad-vocab.json"
    badv.write_text(json.dumps(vocab)[:-1] + ',\n"x": }', encoding="utf-8")
    r, _ = tokenize(work, badv, m, src)
    assert r.returncode == 2 and f"{badv} line 2:" in r.stderr, r.stderr
    r, _ = tokenize(work, work / "none.json", m, src)
    assert r.returncode == 2 and "none.json: No such file" in r.stderr, r.stderr
