"""test_model_py_route.py — GET /v1/jobs/{id}/pytorch on a real server (server/api_pytorch.c,
server/pytorch.c): the answer's type and name, 404 for a job that does not exist, and a job
name that tries to become code. A name is the one string of the spec that reaches model.py;
a user imports that file, so a name holding quotes, a backslash or a docstring's end must
stay a string: the file is ASCII, parses, and its only statements are the module's own.
(That the file builds the right model is tests/parity/test_model_py.py's.)"""
import ast

from pylib.server import seed_spec

HOSTILE = 'x"""\'\'\' + __import__("os").system("touch pwned") #\\ é 中 \U0001f600 \u2028'


def test_model_py_answer(server):
    jid = server.submit(seed_spec(name=HOSTILE))["id"]
    r = server.get(f"/v1/jobs/{jid}/pytorch")
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/x-python"), r.headers
    assert r.headers["Content-Disposition"] == 'attachment; filename="model.py"'
    raw = r.content
    assert raw.isascii(), "model.py is ASCII: every character past it is an escape"
    tree = ast.parse(raw.decode(), "model.py")
    kinds = {type(n).__name__ for n in tree.body}
    assert kinds <= {"Expr", "Import", "ImportFrom", "Assign", "ClassDef", "FunctionDef"}, kinds
    assert isinstance(tree.body[0], ast.Expr), "the docstring comes first"
    consts = {n.targets[0].id: ast.literal_eval(n.value) for n in tree.body
              if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and n.targets[0].id.isupper()
              and not n.targets[0].id.startswith("_")}
    assert consts["JOB_NAME"] == HOSTILE and consts["JOB"] == jid, consts
    assert consts["INPUT_SHAPE"] == (10,) and consts["LOSS"] == "mse"
    funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert funcs == {"build", "read_safetensors", "load"}, funcs  # generate() only for a GPT
    assert "nn.Linear(10, 5)," in raw.decode()
    r = server.get(f"/v1/jobs/{jid}/pytorch?step=3")
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_query", r.text


def test_model_py_of_no_job_is_404(server):
    r = server.get("/v1/jobs/4242/pytorch")
    assert r.status_code == 404, r.text
    assert r.json()["error"] == {"code": "not_found", "message": "job 4242 not found", "path": ""}
