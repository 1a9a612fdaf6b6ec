"""The documents cannot drift from the code (issue 19): every route of the route table
(server/api.c) and its query parameters (the handlers' files, server/api*.c), every error code of schema/err.h, every /metrics name
is in docs/api.md; every key and enum value the validator accepts (the key lists of
schema/spec*.c) is in docs/spec.md, each layer's keys in its own row; every event and event
key the encoder writes (schema/event.c) and every error kind is in docs/events.md; every
source file is in docs/architecture.md; the README and the dashboard link the docs and no
longer send readers to CONTRACT.md or DESIGN.md. The lists are read from the C source, so a
key added to the code without its line in the docs fails here, naming it.

The examples of spec.md go through the real validator and planner (`ddpd-worker --plan`)
on data files of their shapes, and api.md's curl examples must name routes and query
parameters that exist. Each check returns what is missing, and test_checks_can_fail removes one item of each kind
from a copy of the docs to show the check then names it."""
import json
import re
import subprocess

import numpy as np
import pytest

from pylib.common import REPO, bin_dir

DOCS = REPO / "docs"


def read(rel):
    return (REPO / rel).read_text(encoding="utf-8")


def c_arrays(src, suffix):
    """{name: [strings]} of `[static] const char *const NAME<suffix>[] = {...};` in src."""
    out = {}
    pat = r"(?:static )?const char \*const (\w+)" + suffix + r"\[\]\s*=\s*\{(.*?)\};"
    for name, body in re.findall(pat, src, re.S):
        out[name] = re.findall(r'"([^"]*)"', body)
    return out


def backticked(text, word):
    """`word`, or a dotted path ending in it (`ddp.timeout_s`, `init.from_job`)."""
    return re.search(r"`(?:[\w\[\]]+\.)*" + re.escape(word) + r"`", text) is not None


# ---- what the code says ----------------------------------------------------------------

def routes():
    src = read("server/api.c")
    table = src[src.index("static const struct http_route routes[]"):]
    table = table[:table.index("};")]
    # A word capture ({name:word}, http.h) is documented as {name}.
    return [(m, p.replace(":word}", "}")) for m, p in
            re.findall(r'\{"(GET|POST|DELETE|PUT|PATCH)",\s*"([^"]+)"', table)]


def api_sources():
    """The text of every file of the /v1 handlers (server/api*.c; the inference pool's
    metrics are server/inference/pool.c's)."""
    return "".join(p.read_text(encoding="utf-8") for p in sorted((REPO / "server").glob("api*.c")))


def query_params():
    """{param} every route takes (the route table's query lists, and the ones http_query_* read)."""
    src = api_sources()
    names = set()
    for params in handler_params().values():
        names.update(params or ())
    names.update(re.findall(r'http_query(?:_int|_enum)?\(req,\s*"(\w+)"', src))
    return names


def error_codes():
    src = read("schema/err.h")
    rows = re.findall(r'X\((\w+),\s*(\d+),\s*(\d+),\s*"(\w+)",\s*"(\w+)"', src)
    assert len(rows) >= 20, "could not read DDPD_ERR_MAP from schema/err.h"
    return {code for _, _, _, code, _ in rows}, {kind for *_, kind in rows}


def metric_names():
    names = set()
    for src in (api_sources(), read("server/http_route.c"), read("server/inference/pool.c")):
        names.update(re.findall(r"# HELP (ddpd_\w+)", src))
    assert names, "no /metrics names found"
    return names


def spec_lists():
    """The key and name lists of the spec module's files (schema/spec.c, schema/spec_*.c)."""
    src = "".join(p.read_text(encoding="utf-8") for p in sorted((REPO / "schema").glob("spec*.c")))
    keys = c_arrays(src, "_keys")
    names = c_arrays(src, "_names")
    assert "top_keys" in {k + "_keys" for k in keys} and len(keys) >= 10, sorted(keys)
    return keys, names


# layer key list -> the layer types whose row in docs/spec.md must list those keys
LAYER_ROWS = {"linear": ["linear"], "gelu": ["gelu"], "embedding": ["embedding"], "position": ["position"],
              "layernorm": ["layernorm"], "attention": ["attention"], "residual": ["residual"],
              "dropout": ["dropout"], "conv2d": ["conv2d"], "pool": ["maxpool2d", "avgpool2d"],
              "batchnorm": ["batchnorm"]}


def event_lists():
    src = read("schema/event.c")
    kinds = c_arrays(src, "_names").get("kind", [])
    enc = src[src.index("int event_encode("):src.index("/* ---- decoding")]
    keys = set(re.findall(r'\\"(\w+)\\":', enc))
    return set(kinds), keys


def source_files():
    """Every C/CUDA source and header under the code folders, and every dashboard file,
    as docs/architecture.md names them (relative to their top folder)."""
    out = []
    for top in ("base", "schema", "server", "worker", "web"):
        for p in sorted((REPO / top).rglob("*")):
            if p.is_file() and p.suffix in (".c", ".h", ".cu", ".js", ".html", ".css", ".svg"):
                out.append((top, str(p.relative_to(REPO / top))))
    return out


# ---- the checks: each returns what the docs miss -----------------------------------------

def missing_routes(api_md):
    miss = []
    for method, path in routes():
        if path.startswith("/web/"):
            ok = f"`{path}`" in api_md or f"`{method} {path}`" in api_md
        else:
            ok = f"`{method} {path}`" in api_md
        if not ok:
            miss.append(f"{method} {path}")
    return miss


def job_fields():
    """The fields of a job object (api_jobs.c's job_json, and the spec job_text adds)."""
    src = read("server/api_jobs.c")
    body = re.search(r"static json_t \*job_json\(.*?\n\}", src, re.S).group(0)
    return set(re.findall(r'json_object_set_new\(\w+, "(\w+)"', body)) | {"spec"}


def missing_api_words(api_md):
    codes, _ = error_codes()
    miss = [f"job field {f}" for f in sorted(job_fields()) if not re.search(r"`" + f + r"`", api_md)]
    miss += [f"query parameter {q}" for q in sorted(query_params()) if not backticked(api_md, q)]
    miss += [f"error code {c}" for c in sorted(codes) if f"`{c}`" not in api_md]
    miss += [f"metric {m}" for m in sorted(metric_names()) if not re.search(r"`" + m + r"[`{]", api_md)]
    return miss


def missing_spec_keys(spec_md):
    keys, names = spec_lists()
    miss = []
    for arr, lst in sorted(keys.items()):
        miss += [f"{arr}_keys: {k}" for k in lst if not backticked(spec_md, k)]
    for arr, lst in sorted(names.items()):
        miss += [f"{arr}_names: \"{v}\"" for v in lst if f'"{v}"' not in spec_md]
    rows = [ln for ln in spec_md.splitlines() if ln.startswith("| `\"")]
    for arr, types in LAYER_ROWS.items():
        for t in types:
            row = next((ln for ln in rows if f'`"{t}"`' in ln.split("|")[1]), None)
            if row is None:
                miss.append(f"layer row {t}")
                continue
            cells = "|".join(row.split("|")[2:])
            miss += [f"layer {t}: {k}" for k in keys[arr] if k != "type" and f"`{k}`" not in cells]
    return miss


def missing_events(events_md):
    kinds, keys = event_lists()
    _, err_kinds = error_codes()
    assert {"start", "loss", "state"} <= kinds, kinds
    miss = [f"event {k}" for k in sorted(kinds) if f"| `{k}`" not in events_md]
    miss += [f"event key {k}" for k in sorted(keys) if f"`{k}`" not in events_md]
    miss += [f"error kind {k}" for k in sorted(err_kinds) if f"| `{k}`" not in events_md]
    return miss


def missing_files(arch_md):
    return [f"{top}/{rel}" for top, rel in source_files() if f"`{rel}`" not in arch_md]


# ---- the tests ---------------------------------------------------------------------------

def test_every_route_and_its_parameters_codes_and_metrics_are_in_api_md():
    api_md = (DOCS / "api.md").read_text(encoding="utf-8")
    assert len(routes()) >= 14
    assert missing_routes(api_md) == []
    assert missing_api_words(api_md) == []


def handler_params():
    """{(method, path): set of query parameters} from the route table's query column
    (struct http_route's last member); None for a route without one (not checked)."""
    src = read("server/api.c")
    table = src[src.index("static const struct http_route routes[]"):]
    table = table[:table.index("};")]
    out = {}
    for method, path, rest in re.findall(r'\{"(GET|POST|DELETE|PUT|PATCH)",\s*"([^"]+)",([^}]*)\}', table):
        allow = re.search(r',\s*"([^"]*)"\s*$', rest)
        out[(method, path)] = set(allow.group(1).split()) if allow else None
    return out


def bad_curl_examples(api_md):
    """The curl examples of api.md whose method and path match no route, or whose query
    names a parameter the route does not take."""
    table = handler_params()
    bad = []
    lines = [ln for ln in api_md.splitlines() if ln.startswith("curl ")]
    assert len(lines) >= 15, "curl examples"
    for ln in lines:
        url = re.search(r"\$S(/[^\s\"']*)", ln)
        if not url:
            bad.append(ln)
            continue
        path, _, query = url.group(1).partition("?")
        method = "GET"
        if re.search(r"-X (\w+)", ln):
            method = re.search(r"-X (\w+)", ln).group(1)
        elif " -d " in ln:
            method = "POST"
        hit = [k for k in table if k[0] == method and
               re.fullmatch(re.escape(k[1]).replace(r"\{id\}", r"\d+"), path)]
        if not hit:
            bad.append(f"{ln}: no route {method} {path}")
            continue
        allowed = table[hit[0]]
        names = {kv.partition("=")[0] for kv in query.split("&") if kv}
        if allowed is not None and not names <= allowed:
            bad.append(f"{ln}: {method} {hit[0][1]} does not take {sorted(names - allowed)}")
    return bad


def test_curl_examples_use_routes_and_parameters_that_exist():
    assert bad_curl_examples((DOCS / "api.md").read_text(encoding="utf-8")) == []


def test_every_spec_key_and_value_the_validator_accepts_is_in_spec_md():
    spec_md = (DOCS / "spec.md").read_text(encoding="utf-8")
    assert missing_spec_keys(spec_md) == []


def test_spec_md_examples_are_whole_specs_of_known_keys():
    top = set(spec_lists()[0]["top"])
    whole = spec_examples()
    assert len(whole) >= 3, "an example per model family"
    kinds = set()
    for spec in whole:
        assert set(spec) <= top, set(spec) - top
        assert {"model", "loss", "optimizer", "data", "batch_size"} <= set(spec), spec.get("name")
        todo = list(spec["model"])
        while todo:
            layer = todo.pop()
            kinds.add(layer["type"])
            todo += layer.get("layers", [])
    assert {"linear", "attention", "embedding", "conv2d"} <= kinds, kinds


def spec_examples():
    spec_md = (DOCS / "spec.md").read_text(encoding="utf-8")
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)```", spec_md, re.S) if b.lstrip().startswith("{")]


def test_spec_md_examples_pass_the_validator_and_the_planner_on_data_of_their_shape(work):
    """Each example as the server checks a submission: `ddpd-worker --plan` parses it with
    the validator (every shape inferred) and reads data files of the shapes it names."""
    b = bin_dir()
    if b is None:
        pytest.skip("ddpd and ddpd-worker are not built (DDPD_BIN)")
    data = work / "data"
    rng = np.random.default_rng(0)
    for sub, n in (("train", 96), ("val", 40)):
        (data / sub).mkdir(parents=True)
        np.save(data / sub / "x.npy", rng.standard_normal((n, 20), dtype=np.float32))
        np.save(data / sub / "y.npy", rng.integers(0, 4, n, dtype=np.int64))
    (data / "digits").mkdir()
    np.save(data / "digits" / "x.npy", rng.standard_normal((256, 1, 8, 8), dtype=np.float32))
    np.save(data / "digits" / "y.npy", rng.integers(0, 10, 256, dtype=np.int64))
    (data / "gpt-char").mkdir()
    for name, n in (("train.bin", 64 * 50 + 1), ("eval.bin", 64 * 10 + 1)):
        rng.integers(0, 256, n, dtype=np.uint16).astype("<u2").tofile(data / "gpt-char" / name)
    examples = spec_examples()
    lines = "".join(json.dumps({"world_size": s.get("world_size", 1), "spec": s, "data_dir": str(data),
                                "max_rank_memory": 0}) + "\n" for s in examples)
    p = subprocess.run([str(b / "ddpd-worker"), "--plan"], input=lines, capture_output=True, text=True,
                       timeout=120)
    answers = [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip()]
    assert len(answers) == len(examples), (p.stdout, p.stderr)
    for spec, ans in zip(examples, answers):
        assert isinstance(ans.get("batches"), list) and all(n > 0 for n in ans["batches"]), (spec.get("name"), ans)


def test_example_files_the_docs_name_pass_the_validator(work):
    """examples/*.json (spec.md and the README send users there) are valid specs: the
    planner refuses them only for their data files, which are not here."""
    b = bin_dir()
    if b is None:
        pytest.skip("ddpd and ddpd-worker are not built (DDPD_BIN)")
    files = sorted((REPO / "examples").glob("*.json"))
    assert files
    specs = [json.loads(f.read_text(encoding="utf-8")) for f in files]
    lines = "".join(json.dumps({"world_size": s.get("world_size", 1), "spec": s, "data_dir": str(work),
                                "max_rank_memory": 0}) + "\n" for s in specs)
    p = subprocess.run([str(b / "ddpd-worker"), "--plan"], input=lines, capture_output=True, text=True,
                       timeout=120)
    answers = [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip()]
    assert len(answers) == len(files), (p.stdout, p.stderr)
    for f, ans in zip(files, answers):
        assert "batches" in ans or (ans.get("kind") == "data" and "cannot open" in ans.get("message", "")), (f.name, ans)


def test_every_event_key_and_error_kind_is_in_events_md():
    assert missing_events((DOCS / "events.md").read_text(encoding="utf-8")) == []


def test_every_source_file_is_in_architecture_md():
    assert missing_files((DOCS / "architecture.md").read_text(encoding="utf-8")) == []


def test_readme_and_dashboard_link_the_docs_not_contract_or_design():
    readme = read("README.md")
    for d in ("docs/spec.md", "docs/api.md", "docs/events.md", "docs/security.md", "docs/architecture.md"):
        assert f"({d})" in readme, f"README.md does not link {d}"
    web = "".join(p.read_text(encoding="utf-8") for p in sorted((REPO / "web").glob("*.*"))
                  if p.suffix in (".js", ".html"))
    for d in ("docs/spec.md", "docs/api.md", "docs/events.md"):
        assert d in web, f"the dashboard does not link {d}"
    for text, where in ((readme, "README.md"), (web, "web/")):
        for bad in ("CONTRACT.md", "DESIGN.md"):
            assert bad not in text, f"{where} still points at {bad}"


def test_relative_links_of_the_docs_lead_to_files_and_headings():
    pages = sorted(DOCS.glob("*.md")) + [REPO / "README.md", REPO / "schema" / "README.md"]
    bad = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and dest.suffix == ".md":
                heads = [re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")
                         for h in re.findall(r"^#+ (.*)$", dest.read_text(encoding="utf-8"), re.M)]
                if anchor not in heads:
                    bad.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert bad == []


def drop(text, pattern):
    """text with every match of pattern made unrecognisable."""
    out = re.sub(pattern, "REMOVED", text)
    assert out != text, pattern
    return out


@pytest.mark.parametrize("doc, pattern, check, expect", [
    ("api.md", r"`GET /v1/jobs/\{id\}/logs`", missing_routes, "GET /v1/jobs/{id}/logs"),
    ("api.md", r"`tail`", missing_api_words, "query parameter tail"),
    ("api.md", r"`conflict`", missing_api_words, "error code conflict"),
    ("api.md", r"`restart_history`", missing_api_words, "job field restart_history"),
    ("api.md", r"`ddpd_events_committed_total", missing_api_words, "metric ddpd_events_committed_total"),
    ("spec.md", r"`(ddp\.)?timeout_s`", missing_spec_keys, "ddp_keys: timeout_s"),
    ("spec.md", r'"cosine"', missing_spec_keys, 'sched_names: "cosine"'),
    ("spec.md", r"`causal`", missing_spec_keys, "layer attention: causal"),
    ("events.md", r"`grad_norm`", missing_events, "event key grad_norm"),
    ("events.md", r"\| `join`", missing_events, "event join"),
    ("architecture.md", r"`store_curve\.c`", missing_files, "server/store_curve.c"),
    ("api.md", r"tail=50", bad_curl_examples, "curl -s \"$S/v1/jobs/1/logs?rank=1&tial=50\": "
     "GET /v1/jobs/{id}/logs does not take ['tial']"),
])
def test_checks_can_fail(doc, pattern, check, expect):
    text = (DOCS / doc).read_text(encoding="utf-8")
    assert expect not in check(text)
    if check is bad_curl_examples:  # a misspelt parameter instead of a missing word
        if handler_params()[("GET", "/v1/jobs/{id}/logs")] is None:
            pytest.skip("the route table does not list the query parameters")
        assert expect in check(re.sub(pattern, "tial=50", text))
        return
    assert expect in check(drop(text, pattern))
