#!/usr/bin/env python3
"""Writes the data of examples/digits-cnn.json: scikit-learn's handwritten digits (the UCI
optical recognition set that Debian's python3-sklearn ships, sklearn.datasets.load_digits:
1,797 grey images of 8x8 pixels with values 0..16, ten classes) as .npy train/eval splits:
x [N, 1, 8, 8] float32 scaled to [0, 1], y [N] int64 class ids.

The split is a fixed random permutation (seed 0): the first 1,438 images (80 %) train, the
other 359 are held out for eval. None of these numbers were written by ddpd.

The files go into digits/ under the data directory the server (or `ddpd run`) reads,
which examples/digits-cnn.json names them from: --data-dir, else $DDPD_DATA_DIR, else the
current folder (the server's default --data-dir). Every example shares that directory.

    export DDPD_DATA_DIR=$HOME/ddpd-data
    python3 examples/digits_data.py                  # $DDPD_DATA_DIR/digits/{x,y,eval_x,eval_y}.npy
    build/ddpd run --data-dir "$DDPD_DATA_DIR" examples/digits-cnn.json
"""
import argparse
import os
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=os.environ.get("DDPD_DATA_DIR") or ".",
                    help="the server's data directory; the files go into its digits/ "
                         "(default $DDPD_DATA_DIR, else the current folder)")
    ap.add_argument("--eval-fraction", type=float, default=0.2, help="share held out for eval (default 0.2)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the split's permutation (default 0)")
    a = ap.parse_args()
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit("digits_data.py: scikit-learn is missing (Debian: apt-get install python3-sklearn)")
    if not 0 < a.eval_fraction < 1:
        sys.exit("digits_data.py: --eval-fraction must be between 0 and 1")
    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0)[:, None, :, :]  # [N, 1, 8, 8]
    y = d.target.astype(np.int64)
    perm = np.random.default_rng(a.seed).permutation(len(y))
    n_eval = int(round(len(y) * a.eval_fraction))
    tr, ev = perm[n_eval:], perm[:n_eval]
    out = os.path.join(a.data_dir, "digits")
    os.makedirs(out, exist_ok=True)
    np.save(os.path.join(out, "x.npy"), np.ascontiguousarray(x[tr]))
    np.save(os.path.join(out, "y.npy"), y[tr])
    np.save(os.path.join(out, "eval_x.npy"), np.ascontiguousarray(x[ev]))
    np.save(os.path.join(out, "eval_y.npy"), y[ev])
    print(f"{out}: {len(tr)} train and {len(ev)} eval images of 1x8x8, 10 classes")


if __name__ == "__main__":
    main()
