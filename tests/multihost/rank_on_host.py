#!/usr/bin/python3
"""rank_on_host.py — a DDPD_WORKER for the multi-host tests: the launcher (`ddpd run`, or
`ddpd serve`'s local launcher) starts it as it would start `ddpd-worker`; it reads the
rank's stdin document, looks the rank up in DDPD_RANK_HOSTS ("1,1,2,2": rank r runs on
host H of scripts/hosts-up.sh) and becomes the real worker (DDPD_REAL_WORKER) on that
host, in its network, PID and mount namespaces (scripts/hosts-run.sh), with the same
document on stdin. Anything else (`--issue-id`, `--plan`, `--devices`) runs the real
worker here, on the server's host: the rendezvous root listens on DDPD_COMM_ADDR.

This is what a remote shell or a cluster's agent would do on a real second machine; the
worker, its document and the collectives are the product's own. For the fault tests:
  - a host entry "Ht" runs the rank in a time namespace of its own whose monotonic clock
    is DDPD_TIME_OFFSET_S (default 10 days) ahead of the server's;
  - a host entry "fH" runs, instead of the rank, a fake rank on host H that registers with
    the root like a rank, accepts its ring connection and never answers the hello;
  - DDPD_FAKE_ROOT=IP:PORT replaces the id issuer: the id names that address (a listener
    that accepts and never answers), and the stand-in lives, like the issuer, until its
    stdin closes."""
import hashlib
import hmac
import json
import os
import signal
import socket
import struct
import sys

# worker/comm/cpu/wire.h: the id's secret, the root's challenge, the registration's proof.
SECRET_BYTES, COMM_ID_BYTES, PROTO_VERSION, CHALLENGE_BYTES = 16, 128, 2, 40


def addr_bytes(ip, port):
    return struct.pack(">HH", 4, port) + socket.inet_aton(ip) + bytes(12)


def fake_root(where):
    ip, port = where.rsplit(":", 1)
    cid = os.urandom(SECRET_BYTES) + addr_bytes(ip, int(port))
    cid += bytes(COMM_ID_BYTES - len(cid))
    sys.stdout.write(json.dumps({"id": cid.hex()}) + "\n")
    sys.stdout.flush()
    while sys.stdin.buffer.read(4096):
        pass
    sys.exit(0)


def recv_exactly(sock, n):
    buf = b""
    while len(buf) < n:
        more = sock.recv(n - len(buf))
        if not more:
            raise SystemExit("the root closed the connection")
        buf += more
    return buf


def fake_rank(doc, rank, my_ip):
    """Registers as RANK (it holds the id, so its proof holds), accepts the ring connection
    from prev, answers nothing."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # the launcher starts ranks with it held
    cid = bytes.fromhex(doc["comm"]["id"])
    secret = cid[:SECRET_BYTES]
    _, rport = struct.unpack(">HH", cid[16:20])
    rip = socket.inet_ntoa(cid[20:24])
    lsock = socket.socket()
    lsock.bind((my_ip, 0))
    lsock.listen(4)
    root = socket.create_connection((rip, rport), timeout=60)
    challenge = recv_exactly(root, CHALLENGE_BYTES)
    body = struct.pack(">III", PROTO_VERSION, rank, doc["world_size"]) + addr_bytes(my_ip, lsock.getsockname()[1])
    proof = hmac.new(secret, b"ddpd cpu registration\0" + challenge[8:] + body, hashlib.sha256).digest()
    root.sendall(body + proof)
    held = [root]
    while True:  # the launcher ends us with the job's process group
        c, _ = lsock.accept()
        held.append(c)


def main():
    real = os.environ["DDPD_REAL_WORKER"]
    if len(sys.argv) > 1:
        if sys.argv[1:3] == ["--issue-id", "cpu"] and os.environ.get("DDPD_FAKE_ROOT"):
            fake_root(os.environ["DDPD_FAKE_ROOT"])
        os.execv(real, [real] + sys.argv[1:])
    raw = sys.stdin.buffer.read()
    doc = json.loads(raw)
    rank = doc["rank"]
    entry = os.environ["DDPD_RANK_HOSTS"].split(",")[rank]
    run = os.path.join(os.environ["DDPD_REPO"], "scripts", "hosts-run.sh")
    if entry.startswith("f"):
        host = entry[1:]
        os.execv(run, [run, host, sys.executable, os.path.abspath(__file__), "--fake-rank", str(rank),
                       f"10.77.0.{host}", json.dumps(doc)])
    cmd = [real]
    if entry.endswith("t"):
        entry = entry[:-1]
        off = os.environ.get("DDPD_TIME_OFFSET_S", "864000")
        cmd = ["unshare", "--fork", "--kill-child", "--time", f"--monotonic={off}", f"--boottime={off}", real]
    r, w = os.pipe()
    if os.fork() == 0:  # the document goes through a pipe, as the launcher gave it
        os.close(r)
        os.write(w, raw)
        os._exit(0)
    os.close(w)
    os.dup2(r, 0)
    os.close(r)
    os.execv(run, [run, entry] + cmd)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--fake-rank"]:
        fake_rank(json.loads(sys.argv[4]), int(sys.argv[2]), sys.argv[3])
    else:
        main()
