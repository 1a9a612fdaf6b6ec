#!/usr/bin/python3
"""rank_on_host.py — a DDPD_WORKER for the multi-host tests: the launcher (`ddpd run`, or
`ddpd serve`'s local launcher) starts it as it would start `ddpd-worker`; it reads the
rank's stdin document, looks the rank up in DDPD_RANK_HOSTS ("1,1,2,2": rank r runs on
host H of scripts/hosts-up.sh) and becomes the real worker (DDPD_REAL_WORKER) on that
host, in its network, PID and mount namespaces (scripts/hosts-run.sh), with the same
document on stdin. Anything else (`--issue-id`, `--plan`, `--devices`) runs the real
worker here, on the server's host: the rendezvous root listens on DDPD_COMM_ADDR.

This is what a remote shell or a cluster's agent would do on a real second machine; the
worker, its document and the collectives are the product's own."""
import json
import os
import sys

real = os.environ["DDPD_REAL_WORKER"]
if len(sys.argv) > 1:
    os.execv(real, [real] + sys.argv[1:])
doc = sys.stdin.buffer.read()
rank = json.loads(doc)["rank"]
hosts = os.environ["DDPD_RANK_HOSTS"].split(",")
host = hosts[rank]
r, w = os.pipe()
if os.fork() == 0:  # the document goes through a pipe, as the launcher gave it
    os.close(r)
    os.write(w, doc)
    os._exit(0)
os.close(w)
os.dup2(r, 0)
os.close(r)
run = os.path.join(os.environ["DDPD_REPO"], "scripts", "hosts-run.sh")
os.execv(run, [run, host, real])
