#!/bin/sh
# run.sh BIN NAME FUZZ_DIR WORK_DIR SECONDS — the ctest test fuzz.NAME: replays every seed
# (FUZZ_DIR/corpus/NAME) and every past crash (FUZZ_DIR/regressions/NAME) once, then fuzzes
# for SECONDS with those as read-only corpora and WORK_DIR/corpus as the one libFuzzer
# writes to. Prints libFuzzer's final "#N DONE cov: X ft: Y" line and its stats; a crash
# leaves its input in WORK_DIR/artifacts/ and fails the test.
set -eu
bin=$1 name=$2 dir=$3 work=$4 secs=$5
seeds=$dir/corpus/$name
regr=$dir/regressions/$name
rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
dict=""
[ -f "$dir/$name.dict" ] && dict="-dict=$dir/$name.dict"

# libFuzzer runs each file given as an argument once and exits non-zero on a crash.
files=$(find "$seeds" "$regr" -type f 2>/dev/null | sort)
n=$(printf '%s\n' "$files" | grep -c . || true)
echo "== replaying $n inputs of $seeds and $regr"
# shellcheck disable=SC2086
"$bin" -rss_limit_mb=2048 -timeout=10 -artifact_prefix="$work/artifacts/" $files >"$work/replay.log" 2>&1 || {
    tail -n 60 "$work/replay.log"
    exit 1
}

echo "== fuzzing $name for $secs s"
corpora="$seeds"
[ -d "$regr" ] && corpora="$corpora $regr"
# shellcheck disable=SC2086
"$bin" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 $dict \
    -artifact_prefix="$work/artifacts/" "$work/corpus" $corpora >"$work/fuzz.log" 2>&1 || {
    tail -n 80 "$work/fuzz.log"
    echo "fuzz.$name: crash input(s) in $work/artifacts/:"
    ls -l "$work/artifacts/"
    exit 1
}
grep -E '^#[0-9]+[[:space:]]+DONE|^stat::' "$work/fuzz.log"
