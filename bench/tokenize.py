#!/usr/bin/python3
"""bench/tokenize.py — `ddpd tokenize` (GPT-2's byte-level BPE, tokenizer/) against the
fastest BPE available here in Python: OpenAI's encoder.py, pure Python with its cache of
pieces (tests/pylib/bpe.py's Encoder; no tiktoken, no `regex` module here), on the same
text and vocabulary, one thread each:

  bench/tokenize.py --build build            # 50 MB; Python on its first 5 MB (~2 minutes)
  bench/tokenize.py --build build --mb 8     # a smaller text: a smoke check
  bench/tokenize.py --build build --check    # exit 1 when the goal (>= 20 MB/s) is missed

The text: the Python sources of the machine, the standard library's
(/usr/lib/python3.*/**/*.py) then Debian's packages' (/usr/lib/python3/dist-packages), each
in sorted order, each file once, until --mb megabytes: real, varied text (code, comments,
docstrings, some non-ASCII), the same on machines with the same packages. The vocabulary: --merges merges (5000)
learned by tests/pylib/bpe.py's trainer on the text's first 2 MB, the 256 bytes first.
ddpd's time is the command's wall time (start, load, read, encode, write); its MB/s is the
text's size over it. Python's is encode() over the first --py-mb MB, whose ids must equal
ddpd's first ones. Also `ddpd tokenize`'s floor, the command on the same text with a
vocabulary of the 256 bytes and no merges (the pattern, the cache and the writes, no merge
loop). See bench/README.md."""
import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from pylib import bpe  # noqa: E402

GOAL_MB_S = 20.0


def corpus(mb):
    out, n = [], 0
    files = sorted(glob.glob("/usr/lib/python3.*/**/*.py", recursive=True)) + sorted(
        glob.glob("/usr/lib/python3/dist-packages/**/*.py", recursive=True))
    for f in files:
        try:
            t = Path(f).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out.append(t)
        n += len(t.encode("utf-8"))
        if n >= mb * 1_000_000:
            break
    text = "".join(out).encode("utf-8")[:mb * 1_000_000]
    return text.decode("utf-8", errors="ignore")


def run_ddpd(ddpd, v, m, src, out):
    t0 = time.perf_counter()
    r = subprocess.run([ddpd, "tokenize", "--vocab", str(v), "--merges", str(m), "-o", str(out), str(src)],
                       capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    dt = time.perf_counter() - t0
    if r.returncode:
        sys.exit(r.stderr)
    return dt, r.stdout.splitlines()[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--py-mb", type=float, default=5)
    ap.add_argument("--merges", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    ddpd = str(Path(a.build) / "ddpd")
    text = corpus(a.mb)
    raw = text.encode("utf-8")
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-") as d:
        d = Path(d)
        t0 = time.perf_counter()
        vocab, merges = bpe.train(text, a.merges, sample=2_000_000)
        print(f"text: {len(raw) / 1e6:.1f} MB of Python sources (stdlib, dist-packages); vocabulary: "
              f"{len(vocab)} tokens ({len(merges)} merges learned on its first 2 MB in "
              f"{time.perf_counter() - t0:.1f} s)")
        v, m = bpe.write(d, vocab, merges)
        src = d / "in.txt"
        src.write_bytes(raw)
        best = None
        for _ in range(a.rounds):
            dt, summary = run_ddpd(ddpd, v, m, src, d / "out.bin")
            best = dt if best is None else min(best, dt)
        ids = np.fromfile(d / "out.bin", dtype=np.uint16)
        ddpd_mbs = len(raw) / 1e6 / best
        print(f"ddpd tokenize: {ddpd_mbs:.1f} MB/s (best of {a.rounds}: {best:.2f} s; {len(ids)} tokens, "
              f"{len(raw) / len(ids):.2f} bytes a token)\n  {summary}")

        # The floor: no merges (every piece is its bytes).
        bv, bm = d / "bytes.json", d / "bytes.txt"
        bpe.write(d, {bpe.B2U[b]: b for b in range(256)}, [])
        (d / "vocab.json").rename(bv)
        (d / "merges.txt").rename(bm)
        fl = min(run_ddpd(ddpd, bv, bm, src, d / "floor.bin")[0] for _ in range(a.rounds))
        print(f"floor (256 bytes, no merges): {len(raw) / 1e6 / fl:.1f} MB/s")

        part = raw[:int(a.py_mb * 1_000_000)].decode("utf-8", errors="ignore")
        enc = bpe.Encoder(vocab, merges)
        t0 = time.perf_counter()
        pids = enc.encode(part)
        pdt = time.perf_counter() - t0
        py_mbs = len(part.encode("utf-8")) / 1e6 / pdt
        same = ids[:len(pids) - 1].tolist() == pids[:-1]  # the slice's last piece may be cut
        print(f"Python encoder.py (cache, re): {py_mbs:.2f} MB/s on the first {len(part.encode()) / 1e6:.1f} MB "
              f"({pdt:.1f} s); ids equal to ddpd's: {same}")
        print(f"ddpd / Python: {ddpd_mbs / py_mbs:.0f}x; goal >= {GOAL_MB_S:.0f} MB/s: "
              f"{'met' if ddpd_mbs >= GOAL_MB_S else 'MISSED'}")
        if not same or (a.check and ddpd_mbs < GOAL_MB_S):
            sys.exit(1)


if __name__ == "__main__":
    main()
