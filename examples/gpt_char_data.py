#!/usr/bin/env python3
"""Writes the data of examples/gpt-char.json: a character-level (byte) tokens file of a real
English text, split into train.bin (the first 90 %) and eval.bin (the rest), as nanoGPT's
prepare.py does: np.array(ids, np.uint16).tofile(path) — here with the standard library
alone (array('H'), little-endian). Vocabulary: the 256 byte values.

The default text is the GNU GPL version 3, /usr/share/common-licenses/GPL-3, shipped by
Debian's base-files package (essential: on every Debian system). Any other texts may be
named instead; they are joined in order.

Prints the unigram entropy of each split in nats: the loss of a model that ignores the
context and predicts each byte by its frequency in the training split. A model that uses
the context must go well below it.

The files go into gpt-char/ under the data directory the server (or `ddpd run`) reads,
which examples/gpt-char.json names them from: --data-dir, else $DDPD_DATA_DIR, else the
current folder (the server's default --data-dir). Every example shares that directory.

    export DDPD_DATA_DIR=$HOME/ddpd-data
    python3 examples/gpt_char_data.py                 # $DDPD_DATA_DIR/gpt-char/{train,eval}.bin
    build/ddpd run --data-dir "$DDPD_DATA_DIR" examples/gpt-char.json
"""
import argparse
import math
import os
import sys
from array import array
from collections import Counter


def entropy_nats(data, model=None):
    """Cross-entropy of `data` under the byte frequencies of `model`: with model None, the
    entropy of data's own frequencies; else model's counts plus one for each of the 256
    bytes (a byte the model never saw still has a probability)."""
    counts, n, add = (Counter(data), len(data), 0) if model is None else (Counter(model), len(model), 1)
    h = 0.0
    for b, c in Counter(data).items():
        h -= c / len(data) * math.log((counts.get(b, 0) + add) / (n + 256 * add))
    return h


def write_ids(path, data):
    ids = array("H", list(data))  # one uint16 id per byte
    if sys.byteorder != "little":
        ids.byteswap()
    with open(path, "wb") as f:
        ids.tofile(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("texts", nargs="*", default=["/usr/share/common-licenses/GPL-3"])
    ap.add_argument("--data-dir", default=os.environ.get("DDPD_DATA_DIR") or ".",
                    help="the server's data directory; train.bin and eval.bin go into its gpt-char/ "
                         "(default $DDPD_DATA_DIR, else the current folder)")
    ap.add_argument("--eval-fraction", type=float, default=0.1)
    a = ap.parse_args()
    data = b"".join(open(t, "rb").read() for t in a.texts)
    cut = int(len(data) * (1 - a.eval_fraction))
    train, ev = data[:cut], data[cut:]
    out = os.path.join(a.data_dir, "gpt-char")
    os.makedirs(out, exist_ok=True)
    write_ids(os.path.join(out, "train.bin"), train)
    write_ids(os.path.join(out, "eval.bin"), ev)
    print(f"{', '.join(a.texts)}: {len(data)} bytes, {len(set(data))} distinct")
    print(f"{out}/train.bin: {len(train)} tokens; {out}/eval.bin: {len(ev)} tokens (uint16, vocab 256)")
    print(f"unigram entropy of train: {entropy_nats(train):.4f} nats")
    print(f"eval under the train unigram frequencies (add-one): {entropy_nats(ev, train):.4f} nats")


if __name__ == "__main__":
    main()
