"""What the planner finds in the data before a job is accepted, and what it leaves to the
ranks (issue 28), against the real server:
- CSV cells that are NaN, infinite or past float32's range, and repeated header names, are
  a 422 naming the file, the line and the column(s)."""
import pytest

from pylib.server import seed_spec

FINAL = ("succeeded", "failed", "cancelled")


def err_422(server, spec):
    r = server.post("/v1/jobs", json=spec)
    assert r.status_code == 422, f"expected 422, got {r.status_code}: {r.text[:800]}"
    return r.json()["error"]


def no_jobs(server):
    return server.get("/v1/jobs").json()["jobs"] == []


# ---- item 7: CSV cells and header --------------------------------------------------------

def csv_spec(server, text, name="d.csv"):
    (server.data_dir / name).write_text(text)
    return seed_spec(model=[{"type": "linear", "in": 3, "out": 1}], batch_size=2,
                     data={"type": "csv", "path": name, "target": "y"})


GOOD_ROWS = "".join(f"{i},{i + 1},{i + 2},{i % 3}\n" for i in range(20))


@pytest.mark.parametrize("cell", ["nan", "NaN", "-nan", "inf", "-Inf", "+INFINITY", "infinity", " nan(7) ",
                                  '"inf"', "1e39", "-3.5e38"])
def test_csv_cell_that_is_not_finite_is_422_naming_line_and_column(server, cell):
    """The old code accepted these (strtod reads them), and the job then failed at its
    first step with a NaN loss. The cell is the last one of line 19: the check reads every
    cell of the file."""
    rows = GOOD_ROWS.splitlines()
    rows[17] = f"1,2,3,{cell}"
    e = err_422(server, csv_spec(server, "a,b,c,y\n" + "\n".join(rows) + "\n"))
    assert e["path"] == "data", e
    shown = cell[1:-1] if cell.startswith('"') else cell  # the cell's text, quotes off
    assert e["message"].startswith(f'd.csv: line 19, column 4 ("y"): "{shown}" is '), e
    assert "not a finite number" in e["message"] or "beyond float32's range" in e["message"], e
    assert no_jobs(server)


def test_csv_repeated_header_name_is_422_naming_both_columns(server):
    e = err_422(server, csv_spec(server, "a,b,a,y\n" + GOOD_ROWS))
    assert e["path"] == "data", e
    assert e["message"] == ('d.csv: line 1 (the header): columns 1 and 3 are both named "a"; the header\'s '
                            "names must be distinct"), e
    # The target's name repeated is the same error (it was "2 columns are named").
    e = err_422(server, csv_spec(server, "y,b,c,y\n" + GOOD_ROWS))
    assert "columns 1 and 4 are both named \"y\"" in e["message"], e
    # So is a repeat in eval.data, named as the eval data.
    spec = csv_spec(server, "a,b,c,y\n" + GOOD_ROWS)
    (server.data_dir / "v.csv").write_text("a,b,b,y\n1,2,3,4\n")
    spec["eval"] = {"data": {"type": "csv", "path": "v.csv", "target": "y", "shuffle": False}, "every_steps": 5}
    e = err_422(server, spec)
    assert e["message"].startswith('eval.data: v.csv: line 1 (the header): columns 2 and 3 are both named "b"'), e
    assert no_jobs(server)
    server.submit(csv_spec(server, "a,b,c,y\n" + GOOD_ROWS))
