#!/usr/bin/env python3
"""bench/link-floor.py — the link's floor for one 2-host DDP step: hosts 1 and 2 of
scripts/hosts-up.sh send each other NBYTES at once over one TCP connection (what a 2-rank
ring all-reduce of NBYTES of gradients moves each way: half in the reduce-scatter, half in
the all-gather) and the median of REPS such exchanges is printed in ms. Root; hosts up.

  bench/link-floor.py [NBYTES=7450000] [REPS=20]
"""
import os, socket, statistics, subprocess, sys, threading, time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PORT = 29517


def peer(rank, nbytes, reps):
    if rank == 1:
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("10.77.0.2", PORT))
        ls.listen(1)
        s, _ = ls.accept()
    else:
        for _ in range(200):
            try:
                s = socket.create_connection(("10.77.0.2", PORT), timeout=10)
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise SystemExit("link-floor: no connection to 10.77.0.2")
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf, rbuf = bytes(nbytes), bytearray(nbytes)
    out = []
    for _ in range(reps + 2):
        s.sendall(b"x")  # line up both sides
        s.recv(1)
        t = time.perf_counter()
        th = threading.Thread(target=s.sendall, args=(buf,))
        th.start()
        view, got = memoryview(rbuf), 0
        while got < nbytes:
            got += s.recv_into(view[got:])
        th.join()
        out.append(time.perf_counter() - t)
    if rank == 0:
        print(f"link-floor: {nbytes} B each way at once, median of {reps}: "
              f"{statistics.median(out[2:]) * 1e3:.2f} ms ({nbytes / statistics.median(out[2:]) / 1e9:.2f} GB/s each way)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_peer":
        peer(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        sys.exit(0)
    nbytes = int(sys.argv[1]) if len(sys.argv) > 1 else 7450000
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    run = str(REPO / "scripts" / "hosts-run.sh")
    me = [sys.executable, str(Path(__file__).resolve()), "_peer"]
    p1 = subprocess.Popen([run, "2"] + me + ["1", str(nbytes), str(reps)])
    rc = subprocess.call([run, "1"] + me + ["0", str(nbytes), str(reps)], timeout=120)
    p1.wait(timeout=30)
    sys.exit(rc or p1.returncode)
