"""test_newcomer.py — the small things a newcomer met (issue 31), each through the real
server: numbers without float noise in every JSON answer."""
import json
import re

from pylib.server import seed_spec

FINAL = ("succeeded", "failed", "cancelled")

# A real with 16 or more significant digits: what %.17g makes of 0.003 or 451.4.
NOISE = re.compile(r"\d\.?\d*(?:0000000000|9999999999)\d")


def test_json_answers_print_reals_as_written_without_float_noise(server):
    spec = seed_spec(name="noise", optimizer={"type": "sgd", "lr": 0.003, "momentum": 0.9})
    r = server.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    assert '"lr":0.003,' in r.text and '"momentum":0.9' in r.text, r.text
    jid = r.json()["id"]
    server.wait_state(jid, FINAL)
    for path in (f"/v1/jobs/{jid}", "/v1/jobs", f"/v1/jobs/{jid}/metrics", f"/v1/jobs/{jid}/checkpoints"):
        t = server.get(path).text
        assert not NOISE.search(t), (path, NOISE.search(t).group(0), t[:400])
    j = server.get(f"/v1/jobs/{jid}").text
    assert '"lr":0.003,' in j, j
    # Every rank's samples/s is the event's own text (one decimal), not %.17g of it.
    for rk in json.loads(j)["ranks"]:
        v = rk["samples_per_s"]
        assert re.search(r'"samples_per_s":%s[,}]' % re.escape(repr(v)), j), (v, j)
    # The event stream's bodies are the event encoder's, which was already shortest.
    ev = server.get(f"/v1/jobs/{jid}/events", params={"format": "ndjson"}).text
    assert not NOISE.search(ev), NOISE.search(ev).group(0)
