#!/bin/sh
# test.sh — installs what is missing, builds, and runs the whole test suite:
#   1. the normal build (warnings are errors) and every ctest test (tests/slurm against
#      a one-host Slurm that scripts/slurm-up.sh starts and slurm-down.sh stops);
#   2. the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer, and the
#      SQLite fault tests (that build links tests/faults/faultvfs.c into ddpd);
#   3. the tests of threaded code (collectives, DDP, the server, and the emulated CUDA device:
#      its self-tests, NCCL between rank processes, and the server's jobs on emulated GPUs,
#      whose streams are threads) under ThreadSanitizer;
#   4. the fuzz targets of fuzz/ (clang, libFuzzer + ASan + UBSan): each replays its seeds
#      and past crashes, then fuzzes for DDPD_FUZZ_SECONDS (20) seconds.
# First of all, the C sources' layout is checked against .clang-format (clang-format
# --dry-run): `clang-format -i FILE` fixes a file it names.
# Exits non-zero on the first failure. The README's test command; .ci/run calls it.
set -eu
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

scripts/install-deps.sh

echo "== format (.clang-format)"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files '*.c' '*.h' '*.cu' '*.cc' '*.cuh'
else
    find base schema server worker tests fuzz bench examples -name '*.[ch]' -o -name '*.cu' -o -name '*.cc' -o -name '*.cuh'
fi | xargs clang-format --dry-run --Werror

echo "== build (build/)"
cmake -S . -B build -DDDPD_WERROR=ON >build-configure.log 2>&1 || { cat build-configure.log; exit 1; }
grep -A9 "ddpd configuration" build-configure.log || true
cmake --build build -j"$jobs"

# The browser test's playwright-core, from tests/browser/package-lock.json.
if [ ! -d tests/browser/node_modules/playwright-core ]; then
    npm ci --prefix tests/browser --no-audit --no-fund --loglevel=error >/dev/null
fi

# A one-host Slurm (slurmctld + slurmd on localhost) for tests/slurm, stopped on exit.
# DDPD_NO_SLURM=1 leaves it out (those tests then skip).
if [ "${DDPD_NO_SLURM:-0}" != 1 ]; then
    echo "== one-host Slurm (scripts/slurm-up.sh)"
    trap 'scripts/slurm-down.sh' EXIT
    slurm_env=$(scripts/slurm-up.sh)
    eval "$slurm_env"
    export SLURM_CONF
fi

echo "== tests"
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 900

echo "== unit tests under AddressSanitizer + UBSan (build-asan/)"
cmake -S . -B build-asan -DDDPD_CUDA=OFF -DDDPD_SANITIZE=address,undefined -DDDPD_WERROR=ON -DDDPD_FAULT_INJECTION=ON \
    >build-asan-configure.log 2>&1 || { cat build-asan-configure.log; exit 1; }
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -L unit
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -R '^faults\.test_sqlite_faults$'

echo "== threaded tests under ThreadSanitizer (build-tsan/)"
cmake -S . -B build-tsan -DDDPD_CUDA=OFF -DDDPD_SANITIZE=thread -DDDPD_WERROR=ON \
    >build-tsan-configure.log 2>&1 || { cat build-tsan-configure.log; exit 1; }
cmake --build build-tsan -j"$jobs"
TSAN_OPTIONS=halt_on_error=1 \
    ctest --test-dir build-tsan --output-on-failure -j"$jobs" -R 'unit\.test_(comm|ddp|server|http|store|launch|emu$|nccl_emu)|^api\.'

echo "== fuzz targets (build-fuzz/)"
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DDDPD_FUZZ=ON -DDDPD_CUDA=OFF -DDDPD_WERROR=ON \
    >build-fuzz-configure.log 2>&1 || { cat build-fuzz-configure.log; exit 1; }
cmake --build build-fuzz -j"$jobs" --target fuzz_targets
ctest --test-dir build-fuzz --output-on-failure -j"$jobs" -L fuzz
