"""test_tags.py — a job's tags and notes (issue 31; schema/jobmeta.h): given beside the
spec's keys at submit, changed with PATCH /v1/jobs/{id}, shown in the job, kept by a
resume, filtered with GET /v1/jobs?tag=T through an index, and checked: every error a
422 naming `tags[i]` or `notes`, a 404 for no such job."""
import sqlite3

from pylib.server import FOREVER_STEPS, seed_spec, wait_until

FINAL = ("succeeded", "failed", "cancelled")


def err_of(r, status):
    assert r.status_code == status, f"{r.status_code} {r.text}"
    return r.json()["error"]


def ids(server, **params):
    r = server.get("/v1/jobs", params=params)
    assert r.status_code == 200, r.text
    return [j["id"] for j in r.json()["jobs"]]


def test_tags_and_notes_at_submit_show_in_the_job_and_not_in_the_spec(server):
    j = server.submit(seed_spec(name="t", tags=["lr-0.1", "baseline", "ünïcode ok"], notes="first try\n\tindented"))
    assert j["tags"] == ["lr-0.1", "baseline", "ünïcode ok"], j
    assert j["notes"] == "first try\n\tindented", j
    assert "tags" not in j["spec"] and "notes" not in j["spec"], j["spec"]
    g = server.job(j["id"])
    assert g["tags"] == j["tags"] and g["notes"] == j["notes"], g
    # A job without them: an empty list and null.
    k = server.submit(seed_spec(name="plain"))
    assert k["tags"] == [] and k["notes"] is None, k
    assert server.job(k["id"])["tags"] == [], k


def test_the_list_filters_by_tag_exactly_newest_first_with_paging(server):
    a = server.submit(seed_spec(tags=["x", "y"]))["id"]
    b = server.submit(seed_spec(tags=["y"]))["id"]
    c = server.submit(seed_spec(tags=["Y", "x-1"]))["id"]
    d = server.submit(seed_spec(tags=["x"]))["id"]
    assert ids(server, tag="x") == [d, a]
    assert ids(server, tag="y") == [b, a]
    assert ids(server, tag="Y") == [c]
    assert ids(server, tag="nope") == []
    # Pages: the cursor works through the tag's index too.
    r = server.get("/v1/jobs", params={"tag": "y", "limit": 1}).json()
    assert [j["id"] for j in r["jobs"]] == [b] and r["next"] == str(b), r
    assert ids(server, tag="y", before=r["next"]) == [a]
    # With the other filters.
    for jid in (a, b, c, d):
        server.wait_state(jid, FINAL)
    assert ids(server, tag="x", state="succeeded") == [d, a]
    assert ids(server, tag="x", state="failed,cancelled") == []
    assert ids(server, tag="x", state="queued,succeeded") == [d, a]
    # A tag no job can have is a 400 naming the query parameter.
    e = err_of(server.get("/v1/jobs", params={"tag": "t" * 65}), 400)
    assert e["path"] == "tag" and "at most 64 bytes" in e["message"], e


def test_patch_replaces_what_it_names_in_any_state(server):
    jid = server.submit(seed_spec(tags=["a"], notes="n1"))["id"]
    server.wait_state(jid, FINAL)
    r = server.request("PATCH", f"/v1/jobs/{jid}", json={"tags": ["b", "c"]})
    assert r.status_code == 200, r.text
    assert r.json()["tags"] == ["b", "c"] and r.json()["notes"] == "n1", r.json()
    assert ids(server, tag="a") == [] and ids(server, tag="c") == [jid]
    r = server.request("PATCH", f"/v1/jobs/{jid}", json={"notes": "better"})
    assert r.json()["tags"] == ["b", "c"] and r.json()["notes"] == "better", r.json()
    # The cached GET sees the change.
    assert server.job(jid)["notes"] == "better"
    r = server.request("PATCH", f"/v1/jobs/{jid}", json={"tags": [], "notes": None})
    assert r.status_code == 200 and r.json()["tags"] == [] and r.json()["notes"] is None, r.text
    assert server.job(jid)["tags"] == [] and ids(server, tag="b") == []


def test_bad_tags_and_notes_are_422_naming_them(server):
    cases = [
        ({"tags": "x"}, "tags", "expected an array of strings"),
        ({"tags": ["ok", 3]}, "tags[1]", "expected a string"),
        ({"tags": ["ok", ""]}, "tags[1]", "not empty"),
        ({"tags": ["a" * 65]}, "tags[0]", "at most 64 bytes"),
        ({"tags": ["a\u001bb"]}, "tags[0]", "control character U+001B at byte 2"),
        ({"tags": ["a\nb"]}, "tags[0]", "control character U+000A"),
        ({"tags": [" a"]}, "tags[0]", "begins or ends with a space"),
        ({"tags": ["a", "b", "a"]}, "tags[2]", '"a" is tags[0] already'),
        ({"tags": [str(i) for i in range(33)]}, "tags", "at most 32 tags"),
        ({"notes": 5}, "notes", "expected a string"),
        ({"notes": "x" * 4097}, "notes", "at most 4096 bytes"),
        ({"notes": "bell\u0007"}, "notes", "control character U+0007 at byte 5"),
    ]
    jid = server.submit(seed_spec())["id"]
    for body, path, text in cases:
        e = err_of(server.post("/v1/jobs", json=seed_spec(**body)), 422)
        assert e["path"] == path and text in e["message"], (body, e)
        e = err_of(server.request("PATCH", f"/v1/jobs/{jid}", json=body), 422)
        assert e["path"] == path and text in e["message"], (body, e)
    e = err_of(server.request("PATCH", f"/v1/jobs/{jid}", json={"tags": ["a"], "name": "x"}), 422)
    assert e["path"] == "name" and "unknown key" in e["message"], e
    e = err_of(server.request("PATCH", f"/v1/jobs/{jid}", json={}), 422)
    assert "nothing to change" in e["message"], e
    e = err_of(server.request("PATCH", "/v1/jobs/99999", json={"tags": ["a"]}), 404)
    assert e["code"] == "not_found", e
    # Nothing was changed by the refused requests.
    assert server.job(jid)["tags"] == [] and server.job(jid)["notes"] is None


def test_a_resumed_job_keeps_its_tags_and_notes(server):
    jid = server.submit(seed_spec(epochs=None, steps=FOREVER_STEPS, log_every=100, checkpoint={"every_steps": 5},
                                  tags=["sweep-1", "trial-3"], notes="resume me"))["id"]
    server.wait_running(jid)
    wait_until(lambda: server.get(f"/v1/jobs/{jid}/checkpoints").json().get("checkpoints"), 60, "a checkpoint")
    assert server.post(f"/v1/jobs/{jid}/cancel").status_code == 202
    server.wait_state(jid, FINAL)
    r = server.post(f"/v1/jobs/{jid}/resume")
    assert r.status_code == 201, r.text
    assert r.json()["tags"] == ["sweep-1", "trial-3"] and r.json()["notes"] == "resume me", r.json()
    assert ids(server, tag="trial-3") == [r.json()["id"], jid]
    assert server.post(f"/v1/jobs/{r.json()['id']}/cancel").status_code in (202, 409)


def test_the_tag_filter_reads_the_index(server):
    """The list by tag is one range of job_tags' primary key, not a scan of the jobs."""
    server.submit(seed_spec(tags=["x"]))
    db = sqlite3.connect(f"file:{server.db}?mode=ro", uri=True)
    plan = " | ".join(r[3] for r in db.execute(
        "EXPLAIN QUERY PLAN SELECT jobs.id FROM job_tags CROSS JOIN jobs ON jobs.id = job_tags.job "
        "WHERE job_tags.tag = 'x' AND job_tags.job < 100 ORDER BY job_tags.job DESC LIMIT 5"))
    db.close()
    assert "SEARCH job_tags USING PRIMARY KEY (tag=? AND job<?)" in plan, plan
    assert "SCAN jobs" not in plan and "TEMP B-TREE" not in plan, plan
