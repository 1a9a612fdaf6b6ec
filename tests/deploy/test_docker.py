"""test_docker.py — the Docker Compose deployment (docker/, .dockerignore, README) checked
on a machine without a Docker engine.

What runs here:
- `docker-compose config` (Debian's docker-compose 1.29, which validates against its copy
  of the Compose Specification schema) on docker/docker-compose.yml, and the file's
  properties: GPUs reserved (driver nvidia, capabilities [gpu]), a named volume where
  --db and --jobs-dir point, the data folder bind-mounted read-only at --data-dir, the
  token secret used as --token-file, NCCL environment, shared memory, restart policy,
  stop grace period, the `cpu` profile.
- docker/Dockerfile read as text: the stages and their nvidia/cuda images, that every COPY
  source exists and is not dropped by .dockerignore, that CMakeLists.txt's folders are
  copied, a few hadolint rules (hadolint is not packaged by Debian), and that its apt
  package names are Ubuntu 24.04's (the table below says where each name was checked).
- The built binaries: every shared library `ddpd`, `ddpd-worker` and the CUDA module
  libddpd-cuda.so need is installed by the runtime stage (or comes with the base image),
  cross-checked against this host's dpkg; ddpd-worker itself links no CUDA library.
- The real `$DDPD_BIN/ddpd serve`, started with exactly the image's ENTRYPOINT plus each
  service's command, with container paths mapped to a temporary folder and the listen
  address to 127.0.0.1:<ephemeral>: it must start, answer /healthz (also through the
  healthcheck's own curl command), demand the token on /v1, run the seed example, stop on
  SIGTERM within the stop grace period (also with a job running), and find its jobs again
  when restarted on the same state (the upgrade path).

What does not run here: building the image, pulling nvidia/cuda images, apt inside them,
a container seeing GPUs, NCCL between ranks in a container. Those need a Docker engine and
a GPU host.
"""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
COMPOSE = DOCKER / "docker-compose.yml"
DOCKERIGNORE = REPO / ".dockerignore"
README = REPO / "README.md"
SEED = REPO / "examples" / "seed.json"

SERVICES = ("ddpd", "ddpd-cpu")

# Ubuntu 24.04 (noble) names of the packages the Dockerfile installs from Ubuntu, with the
# Debian 12 (bookworm) name of the same library — checked on this host with apt-cache —
# and where the noble name was confirmed. The time_t transition of 2024 renamed some
# noble libraries with a "t64" suffix; of ours libmicrohttpd12, libcurl4 and libssl3.
NOBLE = {
    # build stage
    "build-essential": ("build-essential", "same name in every Debian and Ubuntu release"),
    "cmake": ("cmake", "same name; noble has 3.28 (CMakeLists.txt needs 3.25)"),
    "pkg-config": ("pkg-config", "noble and bookworm: transitional package for pkgconf"),
    "libjansson-dev": ("libjansson-dev", "same name"),
    "libmicrohttpd-dev": ("libmicrohttpd-dev", "same name (dev packages kept their names in t64)"),
    "libsqlite3-dev": ("libsqlite3-dev", "same name"),
    "libopenblas-dev": ("libopenblas-dev", "same name"),
    "libcurl4-openssl-dev": ("libcurl4-openssl-dev", "same name (dev packages kept their names in t64)"),
    "libssl-dev": ("libssl-dev", "same name (dev packages kept their names in t64)"),
    "libpcre2-dev": ("libpcre2-dev", "same name; noble ships PCRE2 10.42, as bookworm"),
    # runtime stage
    "libjansson4": ("libjansson4", "not renamed by t64; in public ubuntu:24.04 Dockerfiles"),
    "libmicrohttpd12t64": ("libmicrohttpd12", "t64 rename; public ubuntu:24.04 Dockerfiles and "
                                              "Salt states install libmicrohttpd12t64 on noble"),
    "libsqlite3-0": ("libsqlite3-0", "not renamed by t64; in public ubuntu:24.04 Dockerfiles"),
    "libopenblas0-pthread": ("libopenblas0-pthread", "same name; noble ships OpenBLAS 0.3.26"),
    "libcurl4t64": ("libcurl4", "t64 rename; noble's libcurl4-openssl-dev depends on libcurl4t64"),
    "libssl3t64": ("libssl3", "t64 rename; noble's libssl-dev depends on libssl3t64 (libcrypto.so.3)"),
    "libpcre2-8-0": ("libpcre2-8-0", "not renamed by t64 (no time_t in its ABI); libpcre2-dev depends on it"),
    "curl": ("curl", "same name (its library became libcurl4t64)"),
    "libssl3t64": ("libssl3", "t64 rename (Debian's time_t transition renamed libssl3 to libssl3t64; "
                              "noble's libcurl4t64 depends on it)"),
}
# Packages from NVIDIA's CUDA repository, which the nvidia/cuda images configure. The
# images pin them in environment variables (e.g. NV_LIBNCCL_DEV_PACKAGE=libnccl-dev=
# 2.27.7-1+cuda13.0 in 13.0.0-devel); the Dockerfile names them through those variables so
# apt keeps the held versions. Not checkable here (no access to NVIDIA's repository).
NVIDIA = {
    "libnccl-dev": "NV_LIBNCCL_DEV_PACKAGE",
    "libcublas-13-0": "NV_LIBCUBLAS_PACKAGE",
    "libnccl2": "NV_LIBNCCL_PACKAGE",
}
# Shared libraries (sonames) -> the noble runtime package that provides them.
SONAME_PACKAGE = {
    "libjansson.so.4": "libjansson4",
    "libmicrohttpd.so.12": "libmicrohttpd12t64",
    "libsqlite3.so.0": "libsqlite3-0",
    "libopenblas.so.0": "libopenblas0-pthread",
    "libcurl.so.4": "libcurl4t64",
    "libcrypto.so.3": "libssl3t64",
    "libpcre2-8.so.0": "libpcre2-8-0",
    "libcublas.so.13": "libcublas-13-0",
    "libcublasLt.so.13": "libcublas-13-0",
    "libnccl.so.2": "libnccl2",
}
# Sonames every nvidia/cuda:13.0.x-runtime-ubuntu24.04 image has: glibc and the GCC
# runtime of Ubuntu's base, and the CUDA runtime (cuda-cudart-13-0 of the base image).
# libcuda.so.1 is the host driver's, mounted by the NVIDIA Container Toolkit.
BASE_SONAMES = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1",
                "libgcc_s.so.1", "libstdc++.so.6", "ld-linux-x86-64.so.2", "libcudart.so.13",
                "libcuda.so.1"}


# ---------------------------------------------------------------------------------------
# the Dockerfile, read as text


def dockerfile_instructions(text):
    """[(KEYWORD, rest)] with line continuations joined and comment lines dropped (as
    Docker does, also inside a continued instruction)."""
    out, cur = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not cur):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip():
            kw, _, rest = cur.strip().partition(" ")
            out.append((kw.upper(), rest.strip()))
        cur = ""
    return out


def dockerfile():
    """{'args': global ARG defaults, 'stages': [{'image', 'name', 'instr': [...]}]}."""
    args, stages = {}, []
    for kw, rest in dockerfile_instructions(DOCKERFILE.read_text()):
        if kw == "ARG" and not stages:
            k, _, v = rest.partition("=")
            args[k.strip()] = v.strip().strip('"')
        elif kw == "FROM":
            parts = rest.split()
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), parts[0])
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append({"image": image, "name": name, "instr": []})
        else:
            assert stages, f"{kw} before the first FROM"
            stages[-1]["instr"].append((kw, rest))
    return {"args": args, "stages": stages}


def instr(stage, kw):
    return [rest for k, rest in stage["instr"] if k == kw]


def json_form(rest, what):
    try:
        v = json.loads(rest)
    except ValueError:
        raise AssertionError(f"{what} is not in JSON (exec) form: {rest}")
    assert isinstance(v, list) and all(isinstance(x, str) for x in v), f"{what}: {rest}"
    return v


def copies(stage):
    """[(from_stage or None, [sources], dest)] of the stage's COPY instructions."""
    out = []
    for rest in instr(stage, "COPY"):
        words = shlex.split(rest)
        frm = None
        while words and words[0].startswith("--"):
            if words[0].startswith("--from="):
                frm = words[0].split("=", 1)[1]
            words = words[1:]
        assert len(words) >= 2, f"COPY {rest}"
        out.append((frm, words[:-1], words[-1]))
    return out


def apt_packages(stage):
    """Every package named by `apt-get install` in the stage: plain names, and for
    "${NV_X:-name}" the pair (NV_X, name)."""
    names = []
    for rest in instr(stage, "RUN"):
        for m in re.finditer(r"apt-get install(.*?)(?:&&|;|$)", rest):
            for w in shlex.split(m.group(1)):
                if w.startswith("-"):
                    continue
                e = re.fullmatch(r"\$\{(\w+):-([\w.+-]+)\}", w)
                names.append((e.group(1), e.group(2)) if e else w)
    return names


def entrypoint():
    final = dockerfile()["stages"][-1]
    eps = instr(final, "ENTRYPOINT")
    assert eps, "the runtime stage has no ENTRYPOINT"
    return json_form(eps[-1], "ENTRYPOINT")


def opt(args, name):
    """The value of the last `name VALUE` in args (ddpd serve: the last one wins)."""
    val = None
    for i, a in enumerate(args[:-1]):
        if a == name:
            val = args[i + 1]
    return val


# ---------------------------------------------------------------------------------------
# the Compose file


def interpolate(v):
    """Compose's ${NAME:-default} / ${NAME} with every variable unset (the defaults)."""
    if isinstance(v, str):
        return re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: m.group(2) or "", v)
    if isinstance(v, list):
        return [interpolate(x) for x in v]
    if isinstance(v, dict):
        return {k: interpolate(x) for k, x in v.items()}
    return v


def compose():
    raw = yaml.safe_load(COMPOSE.read_text())  # merge keys (<<: *ddpd) resolved here
    return interpolate({k: v for k, v in raw.items() if not k.startswith("x-")})


def mounts(svc):
    """[(kind, source, target, read_only)] of a service's volumes (short or long syntax)."""
    out = []
    for v in svc.get("volumes", []):
        if isinstance(v, dict):
            out.append((v.get("type", "volume"), v.get("source"), v["target"], bool(v.get("read_only"))))
            continue
        parts = v.split(":")
        src, dst = parts[0], parts[1]
        mode = parts[2] if len(parts) > 2 else "rw"
        kind = "bind" if src.startswith((".", "/", "~")) else "volume"
        out.append((kind, src, dst, "ro" in mode.split(",")))
    return out


def service_args(name):
    """ENTRYPOINT + the service's command: what `ddpd` gets in the container."""
    svc = compose()["services"][name]
    cmd = svc.get("command", [])
    if isinstance(cmd, str):
        cmd = shlex.split(cmd)
    return entrypoint() + list(cmd)


def duration_s(v):
    m = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", str(v))
    assert m and v, f"a duration like 30s or 1m30s, got {v!r}"
    return int(m.group(1) or 0) * 60 + int(m.group(2) or 0)


def under(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


# ---------------------------------------------------------------------------------------
# .dockerignore (Docker's rules: patterns anchored at the context root, `*` within one
# path element, `**` across elements, a match on a folder excludes everything in it)


def dockerignore_patterns():
    out = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def _pattern_re(p):
    p = p.strip("/")
    rx, i = "", 0
    while i < len(p):
        if p.startswith("**/", i):
            rx += "(?:.*/)?"
            i += 3
        elif p.startswith("**", i):
            rx += ".*"
            i += 2
        elif p[i] == "*":
            rx += "[^/]*"
            i += 1
        elif p[i] == "?":
            rx += "[^/]"
            i += 1
        else:
            rx += re.escape(p[i])
            i += 1
    return re.compile(rx + r"\Z")


def dockerignored(path):
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for p in dockerignore_patterns():
        neg = p.startswith("!")
        rx = _pattern_re(p[1:] if neg else p)
        if any(rx.match(x) for x in prefixes):
            excluded = not neg
    return excluded


# ---------------------------------------------------------------------------------------
# the Compose file: docker-compose's own validation, then the properties


def test_compose_file_is_valid_for_docker_compose():
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (scripts/install-deps.sh installs Debian's)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPD_", "NCCL_", "COMPOSE_"))}
    r = subprocess.run([exe, "-f", str(COMPOSE), "config"], capture_output=True, text=True, env=env,
                       timeout=60, cwd=str(REPO))
    assert r.returncode == 0, f"docker-compose config failed:\n{r.stderr}"
    cfg = yaml.safe_load(r.stdout)
    assert set(cfg["services"]) == set(SERVICES), cfg["services"].keys()
    gpu = cfg["services"]["ddpd"]
    devs = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]} in devs, devs
    for name in SERVICES:
        vols = cfg["services"][name]["volumes"]
        assert "ddpd-state:/var/lib/ddpd:rw" in vols, vols
        assert f"{DOCKER}/data:/data:ro" in vols, vols
        assert cfg["services"][name]["secrets"] == [{"source": "ddpd_token"}]
    assert cfg["services"]["ddpd-cpu"]["profiles"] == ["cpu"]
    assert cfg["secrets"]["ddpd_token"]["file"] == f"{DOCKER}/secrets/ddpd_token"
    assert cfg["volumes"]["ddpd-state"]["name"] == "ddpd-state"
    # The build context is the repository and the Dockerfile is this one.
    assert cfg["services"]["ddpd"]["build"] == {"context": str(REPO), "dockerfile": "docker/Dockerfile"}


def test_gpu_service_reserves_every_gpu():
    svc = compose()["services"]["ddpd"]
    assert "profiles" not in svc, "the GPU service is the default one (no profile)"
    devs = svc["deploy"]["resources"]["reservations"]["devices"]
    nv = [d for d in devs if d.get("driver") == "nvidia"]
    assert len(nv) == 1, devs
    assert nv[0]["capabilities"] == ["gpu"], nv
    assert nv[0].get("count") == "all" and "device_ids" not in nv[0], nv
    assert opt(service_args("ddpd"), "--gpus") == "auto"


def test_cpu_profile_runs_the_same_image_without_gpus():
    c = compose()["services"]
    cpu, gpu = c["ddpd-cpu"], c["ddpd"]
    assert cpu["profiles"] == ["cpu"]
    assert cpu["build"] == gpu["build"] and cpu["image"] == gpu["image"]
    assert "deploy" not in cpu, "the cpu service reserves no devices"
    assert opt(service_args("ddpd-cpu"), "--gpus") == "none"
    # Apart from GPUs and the profile, the two are the same deployment.
    strip = lambda s: {k: v for k, v in s.items() if k not in ("deploy", "profiles", "command")}
    assert strip(cpu) == strip(gpu)


@pytest.mark.parametrize("name", SERVICES)
def test_state_lives_in_a_named_volume(name):
    c = compose()
    args = service_args(name)
    db, jobs = opt(args, "--db"), opt(args, "--jobs-dir")
    assert db and jobs, args
    vols = [m for m in mounts(c["services"][name]) if m[0] == "volume"]
    holders = [m for m in vols if under(db, m[2])]
    assert holders, f"--db {db} is not on a named volume: {vols}"
    kind, src, target, ro = holders[0]
    assert not ro and under(jobs, target), (holders, jobs)
    assert src in c["volumes"], f"volume {src} is not declared at the top level"
    assert c["volumes"][src].get("name") == "ddpd-state", "a fixed volume name, independent of the project"


@pytest.mark.parametrize("name", SERVICES)
def test_data_folder_is_a_read_only_bind_mount(name):
    data = opt(service_args(name), "--data-dir")
    m = [x for x in mounts(compose()["services"][name]) if x[2] == data]
    assert len(m) == 1, f"no mount at --data-dir {data}"
    kind, src, _, ro = m[0]
    assert kind == "bind" and ro, m
    assert src == "./data"
    assert "/docker/data/" in (REPO / ".gitignore").read_text().split()
    assert dockerignored("docker/data/x.npy")


@pytest.mark.parametrize("name", SERVICES)
def test_token_is_a_compose_secret_used_as_token_file(name):
    c = compose()
    args = service_args(name)
    token_file = opt(args, "--token-file")
    assert token_file, "the server must be started with --token-file"
    targets = {}
    for s in c["services"][name]["secrets"]:
        src = s if isinstance(s, str) else s["source"]
        tgt = src if isinstance(s, str) else s.get("target", src)
        targets[tgt if tgt.startswith("/") else f"/run/secrets/{tgt}"] = src
    assert token_file in targets, f"--token-file {token_file} is none of the secrets {targets}"
    top = c["secrets"][targets[token_file]]
    assert "file" in top, top
    # The default file: under docker/, never committed, never sent to a build.
    assert top["file"] == "./secrets/ddpd_token"
    assert "/docker/secrets/" in (REPO / ".gitignore").read_text().split()
    assert dockerignored("docker/secrets/ddpd_token")


@pytest.mark.parametrize("name", SERVICES)
def test_nccl_shm_restart_port_and_stop(name):
    svc = compose()["services"][name]
    env = svc["environment"]
    env = dict(e.split("=", 1) for e in env) if isinstance(env, list) else env
    assert env.get("NCCL_SOCKET_IFNAME") and env.get("NCCL_DEBUG"), env
    # Ranks in one container talk over /dev/shm: Docker's default 64 MB is far too small.
    if svc.get("ipc") != "host":
        size = str(svc["shm_size"]).lower()
        m = re.fullmatch(r"(\d+)\s*([kmg])b?", size)
        assert m, size
        assert int(m.group(1)) * {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2)] >= 1 << 30, size
    assert svc["restart"] in ("always", "unless-stopped", "on-failure"), svc["restart"]
    assert svc.get("init") is True
    # The published port goes to the port the server listens on, which the healthcheck asks.
    listen = opt(service_args(name), "--listen")
    host, _, port = listen.rpartition(":")
    assert host == "0.0.0.0", listen
    assert [p.rsplit(":", 1)[1] for p in svc["ports"]] == [port], svc["ports"]
    hc = svc["healthcheck"]["test"]
    assert hc[0] == "CMD" and f"http://127.0.0.1:{port}/healthz" in hc, hc
    # A stop cancels running jobs: their ranks get SIGTERM, SIGKILL after 5 s, then the
    # database is flushed; the grace period must cover that with room.
    assert duration_s(svc["stop_grace_period"]) >= 15, svc["stop_grace_period"]


# ---------------------------------------------------------------------------------------
# the Dockerfile


def test_dockerfile_stages_use_matching_cuda_13_0_images():
    d = dockerfile()
    version = d["args"].get("CUDA_VERSION", "")
    assert re.fullmatch(r"13\.0\.\d+", version), version
    st = d["stages"]
    assert len(st) >= 2, "multi-stage"
    assert st[0]["image"] == f"nvidia/cuda:{version}-devel-ubuntu24.04", st[0]["image"]
    assert st[-1]["image"] == f"nvidia/cuda:{version}-runtime-ubuntu24.04", st[-1]["image"]
    # Every stage's image has a tag (hadolint DL3006/DL3007: no implicit or "latest").
    for s in st:
        assert ":" in s["image"] and not s["image"].endswith(":latest"), s["image"]
    # The build stage builds the CUDA backend or fails.
    runs = " ".join(instr(st[0], "RUN"))
    assert "-DDDPD_CUDA=ON" in runs and "--target ddpd ddpd-worker ddpd_cuda" in runs, runs
    # ... for every GPU architecture (issue 34: an sm_90-only module fails on an A100 or
    # L40S at its first kernel): DDPD_CUDA_ARCHS all unless the build says otherwise.
    assert "DDPD_CUDA_ARCHS=all" in instr(st[0], "ARG"), instr(st[0], "ARG")
    assert '-DDDPD_CUDA_ARCHS="${DDPD_CUDA_ARCHS}"' in runs and "CMAKE_CUDA_ARCHITECTURES" not in runs, runs
    # The runtime stage resolves the module's libraries too.
    final_runs = " ".join(instr(st[-1], "RUN"))
    assert "ldd /usr/local/bin/ddpd /usr/local/bin/ddpd-worker /usr/local/bin/libddpd-cuda.so" in final_runs


def test_runtime_stage_user_healthcheck_entrypoint():
    d = dockerfile()
    final = d["stages"][-1]
    users = instr(final, "USER")
    assert users and users[-1].split(":")[0] not in ("root", "0"), f"runs as {users}"
    args = entrypoint()
    assert args[:2] == ["ddpd", "serve"], args
    listen = opt(args, "--listen")
    assert listen and listen.startswith("0.0.0.0:"), listen
    port = listen.rsplit(":", 1)[1]
    assert opt(args, "--token-file") == "/run/secrets/ddpd_token"
    assert "--insecure" not in args
    assert port in instr(final, "EXPOSE")[-1].split()
    hc = instr(final, "HEALTHCHECK")
    assert hc, "no HEALTHCHECK"
    cmd = json_form(hc[-1].split(" CMD ", 1)[1], "HEALTHCHECK CMD")
    assert f"http://127.0.0.1:{port}/healthz" in cmd, cmd
    assert "curl" in apt_packages(final), "the healthcheck's curl must be installed"
    # CMD (when any) in JSON form too (hadolint DL3025).
    for c in instr(final, "CMD"):
        json_form(c, "CMD")
    # Both programs side by side on PATH: ddpd finds ddpd-worker beside itself, and
    # ddpd-worker its CUDA module (worker/cuda/loader.c).
    from_build = [c for c in copies(final) if c[0] == d["stages"][0]["name"]]
    assert from_build, "nothing copied from the build stage"
    srcs = [Path(s).name for c in from_build for s in c[1]]
    assert sorted(srcs) == ["ddpd", "ddpd-worker", "libddpd-cuda.so"], srcs
    assert all(s == "/build/" + Path(s).name for c in from_build for s in c[1]), from_build
    assert {c[2] for c in from_build} == {"/usr/local/bin/"}
    # The dashboard is copied where --web-dir points.
    web = opt(args, "--web-dir")
    assert [c for c in copies(final) if c[0] is None and c[2].rstrip("/") == web and c[1] == ["web/"]]


def test_copy_sources_exist_and_reach_the_build():
    d = dockerfile()
    seen = set()
    for st in d["stages"]:
        for frm, srcs, _dest in copies(st):
            if frm is not None:
                assert frm in [s["name"] for s in d["stages"]], f"COPY --from={frm}: no such stage"
                continue
            for s in srcs:
                p = REPO / s
                assert p.exists(), f"COPY {s}: not in the repository"
                assert not dockerignored(s.rstrip("/")), f"COPY {s}: excluded by .dockerignore"
                seen.add(s.rstrip("/"))
    # What CMakeLists.txt reads must be in the build stage: its subdirectories, the folders
    # its globs list sources in, its module path and the dashboard it bakes in.
    cm = (REPO / "CMakeLists.txt").read_text()
    needed = {"CMakeLists.txt", "cmake", "web"}
    needed |= set(re.findall(r"add_subdirectory\((\w+)\)", cm))
    needed |= {m.split("/")[0] for m in re.findall(r"\b(\w+/[\w/]*\*\.(?:c|cu))\b", cm)}
    build = {s.rstrip("/") for frm, srcs, _ in copies(d["stages"][0]) if frm is None for s in srcs}
    assert needed <= build, f"the build stage does not copy {sorted(needed - build)}"
    assert seen, "no COPY from the build context"


def test_dockerignore_keeps_build_folders_databases_and_secrets_out():
    for path in ["build/ddpd", "build-docker/CMakeCache.txt", "build-asan/x", "var/ddpd.db",
                 "var/jobs/1/model.safetensors", "some/where/ddpd.db", "x.db-wal", ".git/HEAD",
                 "docker/secrets/ddpd_token", "docker/data/train.npy", "docker/.env",
                 "tests/browser/node_modules/playwright-core/index.js", "tests/api/__pycache__/a.pyc",
                 "build-configure.log"]:
        assert dockerignored(path), f".dockerignore lets {path} into the build context"
    for path in ["CMakeLists.txt", "server/serve.c", "web/index.html", "tests/CMakeLists.txt",
                 "docker/Dockerfile", "cmake/FindNCCL.cmake"]:
        assert not dockerignored(path), f".dockerignore drops {path}"


def test_apt_usage_follows_hadolint_rules():
    """hadolint is not in Debian 12; these are its rules that apply here: DL3015 (no
    recommends), DL3009 (apt lists deleted in the same layer), DL3014 (-y), DL3027 (apt-get,
    not apt)."""
    for st in dockerfile()["stages"]:
        for rest in instr(st, "RUN"):
            if "apt-get install" not in rest:
                assert not re.search(r"\bapt (install|update)\b", rest), rest
                continue
            assert "--no-install-recommends" in rest, rest
            assert "-y" in rest.split(), rest
            assert "rm -rf /var/lib/apt/lists/*" in rest, rest
            assert "apt-get update" in rest, rest


def test_apt_package_names_are_ubuntu_24_04_names():
    stages = dockerfile()["stages"]
    have_apt = shutil.which("apt-cache") is not None
    for st in (stages[0], stages[-1]):
        for p in apt_packages(st):
            if isinstance(p, tuple):
                env, default = p
                assert NVIDIA.get(default) == env, f"{p}: expected one of {NVIDIA}"
                continue
            assert p in NOBLE, f"{p}: not a package name this test knows for Ubuntu 24.04"
            debian, _note = NOBLE[p]
            assert p == debian or p == debian + "t64", (p, debian)
            if have_apt:
                r = subprocess.run(["apt-cache", "show", "--no-all-versions", debian], capture_output=True,
                                   text=True, timeout=60)
                assert r.returncode == 0 and f"Package: {debian}" in r.stdout, \
                    f"{debian} (Debian's name of {p}) is unknown to apt here: {r.stderr}"


def test_build_stage_has_the_dev_packages_of_install_deps():
    script = (REPO / "scripts" / "install-deps.sh").read_text()
    listed = re.search(r'PACKAGES="(.*?)"', script, re.S).group(1).split()
    # The libraries ddpd links; the fuzzers' clang runtime is test tooling, not the product's.
    devs = {p for p in listed if p.startswith("lib") and p.endswith("-dev") and not p.startswith("libclang-rt")}
    build = {p if isinstance(p, str) else p[1] for p in apt_packages(dockerfile()["stages"][0])}
    assert devs and devs <= build, f"build stage lacks {sorted(devs - build)}"
    assert {"cmake", "pkg-config", "build-essential", "libnccl-dev"} <= build


# ---------------------------------------------------------------------------------------
# the built programs against the runtime stage


def bin_dir():
    d = os.environ.get("DDPD_BIN")
    c = Path(d) if d else REPO / "build"
    if (c / "ddpd").is_file() and (c / "ddpd-worker").is_file():
        return c.resolve()
    return None


def needed(path):
    r = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", r.stdout)


def test_runtime_stage_installs_every_library_the_programs_need():
    b = bin_dir()
    if b is None:
        pytest.skip("ddpd is not built (set DDPD_BIN to the build folder)")
    if shutil.which("readelf") is None:
        pytest.skip("readelf (binutils) is not installed")
    final = dockerfile()["stages"][-1]
    runtime = {p if isinstance(p, str) else p[1] for p in apt_packages(final)}
    module = b / "libddpd-cuda.so"
    progs = ("ddpd", "ddpd-worker") + (("libddpd-cuda.so",) if module.exists() else ())
    for prog in progs:
        for so in needed(b / prog):
            if so in BASE_SONAMES:
                continue
            assert so in SONAME_PACKAGE, f"{prog} needs {so}: which Ubuntu package has it?"
            assert SONAME_PACKAGE[so] in runtime, f"{prog} needs {so} ({SONAME_PACKAGE[so]}), " \
                                                  f"which the runtime stage does not install"
    # The CUDA module links cuBLAS and NCCL (CMakeLists.txt), which the image always builds
    # (-DDDPD_CUDA=ON), even where the linker drops them as unused; the worker itself links
    # none of CUDA, so that CPU jobs start fast.
    assert {"libcublas-13-0", "libnccl2"} <= runtime
    cuda = [so for so in needed(b / "ddpd-worker") if re.match(r"lib(cuda|cudart|cublas|nccl)", so)]
    assert not cuda, f"ddpd-worker links {cuda}: they belong in libddpd-cuda.so"
    if module.exists():
        assert {"libcublas.so.13", "libnccl.so.2"} <= set(needed(module)), needed(module)


def test_library_packages_match_this_hosts_dpkg():
    """Where the library comes from Debian here, dpkg's owner of the file the loader picks
    must be the noble package's Debian name (or that name before the t64 rename)."""
    b = bin_dir()
    if b is None:
        pytest.skip("ddpd is not built (set DDPD_BIN to the build folder)")
    if shutil.which("dpkg") is None or shutil.which("ldd") is None:
        pytest.skip("dpkg and ldd are needed")
    checked = 0
    progs = [b / "ddpd", b / "ddpd-worker"] + [m for m in [b / "libddpd-cuda.so"] if m.exists()]
    for prog in progs:
        r = subprocess.run(["ldd", str(prog)], capture_output=True, text=True, timeout=30)
        for so, path in re.findall(r"^\s*(\S+) => (/\S+)", r.stdout, re.M):
            pkg = SONAME_PACKAGE.get(so)
            if pkg is None or pkg in NVIDIA:
                continue
            # dpkg knows files by their /usr path (merged /usr) and real name.
            d = subprocess.run(["dpkg", "-S", os.path.realpath(path)], capture_output=True, text=True,
                               timeout=30)
            assert d.returncode == 0, f"{path}: no Debian package owns it here"
            owner = d.stdout.split(":", 1)[0]
            assert NOBLE[pkg][0] == owner, f"{so}: {path} is {owner}'s here, the table says {NOBLE[pkg][0]}"
            checked += 1
    assert checked >= 4, "jansson, microhttpd, sqlite3 and openblas all checked"


# ---------------------------------------------------------------------------------------
# the real server with the image's arguments


class Served:
    """`ddpd serve` with a service's container arguments mapped onto a temporary folder."""

    PORT_RE = re.compile(r"\(port (\d+)\)")

    def __init__(self, root, name, extra=(), token="s3cret-token"):
        b = bin_dir()
        if b is None:
            pytest.skip("ddpd is not built (set DDPD_BIN to the build folder)")
        self.bin, self.root, self.token = b, Path(root), token
        c = compose()
        svc = c["services"][name]
        # Container paths -> host paths: the service's mounts, the secrets, and what the
        # image copies from the repository. A path option the container could not have
        # fails the test here.
        self.map = {"/run/secrets": self.root / "secrets"}
        for kind, _src, target, _ro in mounts(svc):
            self.map[target] = self.root / ("vol" if kind == "volume" else "bind") / target.strip("/")
        for p in self.map.values():
            p.mkdir(parents=True, exist_ok=True)
        for frm, srcs, dest in copies(dockerfile()["stages"][-1]):
            if frm is None and len(srcs) == 1 and (REPO / srcs[0]).is_dir():
                self.map[dest.rstrip("/")] = REPO / srcs[0].rstrip("/")
        tokfile = self.root / "secrets" / "ddpd_token"
        if token is not None:
            tokfile.write_text(token + "\n")
        self.args = []
        for a in service_args(name)[2:] + list(extra):
            if a.startswith("0.0.0.0:"):
                a = "127.0.0.1:0"
            elif a.startswith("/"):
                base = max((k for k in self.map if under(a, k)), key=len, default=None)
                assert base is not None, f"{a}: neither mounted, a secret, nor copied into the image"
                a = str(self.map[base]) + a[len(base):]
            self.args.append(a)
        self.proc = None
        self.starts = 0

    def path(self, container_path):
        base = max(k for k in self.map if under(container_path, k))
        return Path(str(self.map[base]) + container_path[len(base):])

    def start(self, timeout=30):
        self.starts += 1
        self.err = self.root / f"serve-{self.starts}.err"
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        with open(self.err, "wb") as f:
            self.proc = subprocess.Popen([str(self.bin / "ddpd"), "serve", *self.args], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=f, cwd=str(self.root), env=env,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.PORT_RE.search(self.stderr())
            if m:
                self.port = int(m.group(1))
                self.url = f"http://127.0.0.1:{self.port}"
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"ddpd serve exited with {self.proc.returncode}: {self.args}\n{self.stderr()}")
            time.sleep(0.05)
        raise AssertionError(f"ddpd serve did not listen within {timeout}s:\n{self.stderr()}")

    def stderr(self):
        try:
            return self.err.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout):
        """SIGTERM; the exit code and the seconds it took (AssertionError after timeout)."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"ddpd serve did not exit within {timeout}s of SIGTERM:\n{self.stderr()[-2000:]}")
        return rc, time.monotonic() - t0

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)

    def req(self, method, path, auth=True, ctype=None, **kw):
        import requests
        h = {"Authorization": f"Bearer {self.token}"} if auth else {}
        if ctype:
            h["Content-Type"] = ctype
        return requests.request(method, self.url + path, headers=h, timeout=15, **kw)

    def wait_job(self, jid, states, timeout):
        deadline = time.monotonic() + timeout
        j = None
        while time.monotonic() < deadline:
            j = self.req("GET", f"/v1/jobs/{jid}").json()
            if j["state"] in states:
                return j
            time.sleep(0.1)
        raise AssertionError(f"job {jid} not in {states} within {timeout}s: {j}\n{self.stderr()[-2000:]}")


@pytest.fixture
def work():
    pytest.importorskip("requests")
    t = os.environ.get("DDPD_TEST_TMP")
    if t:
        Path(t).mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix="deploy-", dir=t or None))
    made = []
    yield d, made
    for s in made:
        s.kill()
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("name", SERVICES)
def test_image_arguments_start_the_real_server(work, name):
    root, made = work
    s = Served(root, name)
    made.append(s)
    s.start()
    assert "with a token" in s.stderr(), s.stderr()
    # /healthz is open; /v1 needs the token from the secret.
    assert s.req("GET", "/healthz", auth=False).status_code == 200
    assert s.req("GET", "/v1/jobs", auth=False).status_code == 401
    assert s.req("GET", "/v1/jobs").status_code == 200
    assert s.req("GET", "/", auth=False).status_code == 200, "the dashboard from --web-dir"
    # The healthcheck's own command, against this server's port.
    hc = compose()["services"][name]["healthcheck"]["test"][1:]
    hc = [a.replace("127.0.0.1:8080", f"127.0.0.1:{s.port}") for a in hc]
    if shutil.which(hc[0]):
        assert subprocess.run(hc, capture_output=True, timeout=20).returncode == 0, hc
    # The README's example job runs and leaves its files in the state volume.
    r = s.req("POST", "/v1/jobs", data=SEED.read_bytes(), ctype="application/json")
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    j = s.wait_job(jid, ("succeeded", "failed", "cancelled"), 120)
    assert j["state"] == "succeeded", j
    args = service_args(name)
    assert s.path(opt(args, "--db")).is_file()
    assert any(s.path(opt(args, "--jobs-dir")).iterdir()), "the job's files are in --jobs-dir"
    grace = duration_s(compose()["services"][name]["stop_grace_period"])
    rc, took = s.stop(grace)
    assert rc == 0, s.stderr()[-2000:]
    # Upgrade: a new server on the same volume finds the job, its events and its files.
    s.start()
    j2 = s.req("GET", f"/v1/jobs/{jid}").json()
    assert j2["state"] == "succeeded" and j2["step"] == j["step"], j2
    ev = s.req("GET", f"/v1/jobs/{jid}/events", params={"format": "ndjson"}).text.splitlines()
    assert any(json.loads(x).get("event") == "done" for x in ev if x.strip()), ev[-3:]
    assert s.req("GET", f"/v1/jobs/{jid}/checkpoint").status_code == 200
    rc, _ = s.stop(grace)
    assert rc == 0


def test_stop_with_a_running_job_fits_the_grace_period(work):
    root, made = work
    s = Served(root, "ddpd-cpu")
    made.append(s)
    s.start()
    spec = json.loads(SEED.read_text())
    spec.pop("epochs", None)
    spec.update(name="long", steps=10_000_000, log_every=1000)
    r = s.req("POST", "/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    s.wait_job(jid, ("running",), 60)
    grace = duration_s(compose()["services"]["ddpd-cpu"]["stop_grace_period"])
    rc, took = s.stop(grace)
    assert rc == 0 and took < grace, (rc, took, s.stderr()[-2000:])
    s.start()
    j = s.req("GET", f"/v1/jobs/{jid}").json()
    assert j["state"] == "cancelled" and "shutting down" in (j.get("error") or ""), j
    s.stop(grace)


def test_without_the_secret_the_image_refuses_to_start(work):
    root, made = work
    b = bin_dir()
    s = Served(root, "ddpd", token=None)  # the secret file does not exist
    made.append(s)
    r = subprocess.run([str(b / "ddpd"), "serve", *s.args], capture_output=True, text=True, timeout=30,
                       cwd=str(root))
    assert r.returncode == 2 and "--token-file" in r.stderr, r.stderr
    # And on the image's own address, dropping --token-file is refused before any socket.
    args = []
    skip = False
    for a in s.args:
        if skip:
            skip = False
            continue
        if a == "--token-file":
            skip = True
            continue
        args.append("0.0.0.0:8080" if a == "127.0.0.1:0" else a)
    r = subprocess.run([str(b / "ddpd"), "serve", *args], capture_output=True, text=True, timeout=30,
                       cwd=str(root))
    assert r.returncode == 2 and "refusing to listen" in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------
# README


def readme_section():
    text = README.read_text()
    m = re.search(r"^## Deploy with Docker Compose\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, "README.md has no '## Deploy with Docker Compose' section"
    return text, m


def test_readme_deploy_section():
    text, m = readme_section()
    body = m.group(1)
    # After the existing sections: the last one.
    assert not re.search(r"^## ", text[m.end():], re.M), "the deploy section comes last"
    # The two commands at the top are unchanged.
    assert text.index("scripts/install-deps.sh && cmake -S . -B build && cmake --build build -j && build/ddpd serve") \
        < text.index("scripts/test.sh") < m.start()
    blocks = re.findall(r"```sh\n(.*?)```", body, re.S)
    assert blocks, "no commands"
    first = [l for l in blocks[0].splitlines() if l.strip() and not l.startswith("#")]
    assert len(first) == 3, f"three commands from clone to a running server: {first}"
    assert first[0].startswith("git clone") and "cd ddpd/docker" in first[0], first[0]
    # The second creates exactly the secret file the Compose file reads.
    secret = compose()["secrets"]["ddpd_token"]["file"].removeprefix("./")
    assert f"> {secret}" in first[1] and "chmod 644" in first[1], first[1]
    assert first[2].startswith("docker compose up -d"), first[2]
    allcmd = "\n".join(blocks)
    assert "Authorization: Bearer" in allcmd and "examples/seed.json" in allcmd
    assert "--profile cpu" in allcmd and "ddpd-cpu" in allcmd
    for word in ("ddpd-state", "/data", "/var/lib/ddpd", "user_version", "--on-shutdown"):
        assert word in body, f"the deploy section does not mention {word}"
