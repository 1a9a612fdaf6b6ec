"""The server killed with SIGKILL at random moments during a burst of submissions (4
client threads) and a running job, 20 trials on one database. After each kill: the
database passes `PRAGMA integrity_check`; after the restart on the same database, every
job whose POST was answered 201 is there exactly once, with its name and spec, and no job
is there twice (each submission has a unique name); the job that was running is failed
with "server restarted" and its processes are gone."""
import random
import sqlite3
import threading
import time

import requests

from pylib.server import FOREVER_STEPS, heavy_spec, seed_spec, wait_until

TRIALS = 20
CLIENTS = 4
FINAL = ("succeeded", "failed", "cancelled")


def tiny(name):
    return seed_spec(name=name, epochs=None, steps=1, model=[{"type": "linear", "in": 2, "out": 1}],
                     data={"type": "synthetic", "samples": 8, "seed": 1}, batch_size=2)


def burst(url, trial, client, stop, out):
    """POSTs jobs until `stop`; out[name] = ("id", id) when answered 201, None when the
    answer never came (the server died first), else ("status", code, text)."""
    k = 0
    s = requests.Session()
    while not stop.is_set():
        name = f"t{trial}-c{client}-{k}"
        k += 1
        try:
            r = s.post(url + "/v1/jobs", json=tiny(name), timeout=10)
        except requests.RequestException:
            out[name] = None
            return
        out[name] = ("id", r.json()["id"]) if r.status_code == 201 else ("status", r.status_code, r.text[:200])


def test_server_sigkill_during_submissions(make_server):
    rng = random.Random(20)
    srv = make_server(cpu_slots=1)
    rows = []
    accepted_all = {}
    for trial in range(TRIALS):
        if not srv.running():
            srv.start()
        running = srv.submit(heavy_spec(1, steps=FOREVER_STEPS, name=f"t{trial}-running"))["id"]
        srv.wait_running(running)
        out, stop = {}, threading.Event()
        threads = [threading.Thread(target=burst, args=(srv.url, trial, c, stop, out)) for c in range(CLIENTS)]
        for t in threads:
            t.start()
        delay = rng.uniform(0.05, 1.5)
        time.sleep(delay)
        srv.kill9()
        stop.set()
        for t in threads:
            t.join(30)
        accepted = {n: v[1] for n, v in out.items() if v and v[0] == "id"}
        others = {n: i for n, i in out.items() if n not in accepted}
        assert not [i for i in others.values() if i is not None], f"trial {trial}: refused submissions: {others}"
        # The crash state itself is a sound database.
        with sqlite3.connect(str(srv.db)) as c:
            assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok", f"trial {trial}"
        srv.start()
        with sqlite3.connect(f"file:{srv.db}?mode=ro", uri=True) as c:
            rows_db = c.execute("SELECT id, name FROM jobs WHERE name LIKE ?", (f"t{trial}-%",)).fetchall()
            dups = c.execute("SELECT name, count(*) FROM jobs GROUP BY name HAVING count(*) > 1").fetchall()
        by_name = {}
        for i, n in rows_db:
            by_name.setdefault(n, []).append(i)
        lost = {n: i for n, i in accepted.items() if by_name.get(n) != [i]}
        assert not lost, f"trial {trial}: accepted jobs missing or changed after the restart: {lost}"
        assert not dups, f"trial {trial}: jobs stored twice: {dups}"
        strays = [n for n in by_name if n not in out and n != f"t{trial}-running"]
        assert not strays, f"trial {trial}: jobs nobody submitted: {strays}"
        unanswered_stored = sum(1 for n, i in others.items() if n in by_name)
        for n, i in list(accepted.items())[:3]:
            j = srv.job(i)
            assert j["name"] == n and j["spec"]["model"] == [{"type": "linear", "in": 2, "out": 1, "bias": True}], j
        j = srv.wait_state(running, FINAL, timeout=15)
        assert j["state"] == "failed" and j["error"] == "server restarted", j
        accepted_all.update(accepted)
        rows.append((trial, delay, len(out), len(accepted), len(others), unanswered_stored))
        # Next trial from an empty queue: cancel what the burst left.
        active = srv.get("/v1/jobs?state=queued,starting,running&limit=1000").json()["jobs"]
        for a in active:
            srv.post(f"/v1/jobs/{a['id']}/cancel")
        wait_until(lambda: not srv.get("/v1/jobs?state=queued,starting,running&limit=1").json()["jobs"], 60,
                   "the burst's jobs to be cancelled")
    # Every job accepted in any trial is still there at the end.
    with sqlite3.connect(f"file:{srv.db}?mode=ro", uri=True) as c:
        ids = {r[0]: r[1] for r in c.execute("SELECT id, name FROM jobs")}
    assert all(ids.get(i) == n for n, i in accepted_all.items())
    for trial, delay, sent, acc, unanswered, stored in rows:
        print(f"trial {trial:2d}: SIGKILL {delay:.2f}s into the burst: {sent} POSTs, {acc} answered 201 (all "
              f"present once), {unanswered} unanswered ({stored} of them stored)")
    print(f"{TRIALS} trials: {len(accepted_all)} accepted jobs, none lost or duplicated; integrity_check ok after "
          f"every kill")
    assert len(accepted_all) >= TRIALS, "too few submissions were accepted to mean anything"
