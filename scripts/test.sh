#!/bin/sh
# test.sh — installs what is missing, builds, and runs the whole test suite:
#   1. the normal build (warnings are errors) and every ctest test;
#   2. the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer;
#   3. the tests of threaded code (collectives, DDP, the server) under ThreadSanitizer.
# Exits non-zero on the first failure. The README's test command; .ci/run calls it.
set -eu
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

scripts/install-deps.sh

echo "== build (build/)"
cmake -S . -B build -DDDPD_WERROR=ON >build-configure.log 2>&1 || { cat build-configure.log; exit 1; }
grep -A8 'ddpd configuration' build-configure.log || true
cmake --build build -j"$jobs"

# The browser test's playwright-core, from tests/browser/package-lock.json.
if [ ! -d tests/browser/node_modules/playwright-core ]; then
    npm ci --prefix tests/browser --no-audit --no-fund --loglevel=error >/dev/null
fi

echo "== tests"
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 900

echo "== unit tests under AddressSanitizer + UBSan (build-asan/)"
cmake -S . -B build-asan -DDDPD_CUDA=OFF -DDDPD_SANITIZE=address,undefined -DDDPD_WERROR=ON \
    >build-asan-configure.log 2>&1 || { cat build-asan-configure.log; exit 1; }
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -L unit

echo "== threaded tests under ThreadSanitizer (build-tsan/)"
cmake -S . -B build-tsan -DDDPD_CUDA=OFF -DDDPD_SANITIZE=thread -DDDPD_WERROR=ON \
    >build-tsan-configure.log 2>&1 || { cat build-tsan-configure.log; exit 1; }
cmake --build build-tsan -j"$jobs"
TSAN_OPTIONS=halt_on_error=1 \
    ctest --test-dir build-tsan --output-on-failure -j"$jobs" -R 'unit\.test_(comm|ddp|server|http|store|launch)|^api\.'
