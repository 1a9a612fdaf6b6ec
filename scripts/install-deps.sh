#!/bin/sh
# install-deps.sh — installs the Debian 12 packages that ddpd's build and tests need.
# Idempotent and quiet when everything is present. Run as root (or with sudo).
# The CUDA toolkit (nvcc, cuBLAS, NCCL) is not a Debian package: where it is installed
# under /usr/local/cuda the build picks it up; without it the build is CPU-only.
# libpcre2-dev: the GPT-2 tokenizer's pattern (tokenizer/encode.c).
# clang and libclang-rt-14-dev (libFuzzer, ASan, UBSan runtimes) build the fuzz targets
# of fuzz/ (scripts/test.sh's fuzz stage); clang-format checks the C sources' layout (.clang-format).
# docker-compose (Compose v1, Python) only validates docker/docker-compose.yml in
# tests/deploy; these machines run no Docker engine.
# slurm-wlm and munge: the one-host Slurm of scripts/slurm-up.sh for tests/slurm.
# iproute2 (ip, tc): the namespaced hosts of scripts/hosts-up.sh for tests/multihost.
set -eu

PACKAGES="
build-essential cmake pkg-config
libjansson-dev libopenblas-dev libmicrohttpd-dev libsqlite3-dev sqlite3 libcurl4-openssl-dev libssl-dev libpcre2-dev
python3 python3-pytest python3-numpy python3-requests python3-torch python3-sklearn
curl procps
chromium
clang libclang-rt-14-dev clang-format
docker-compose python3-yaml
slurm-wlm munge
iproute2
"

missing=""
for p in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
# Node.js and npm for the browser test (tests/browser): Debian's only when there are none
# (a Node.js from elsewhere, which brings its own npm, is kept).
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
else
    SUDO=
fi
echo "install-deps: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
