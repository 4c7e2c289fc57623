#!/usr/bin/env bash
# Runs one libFuzzer harness of tests/fuzz/ on its committed seed corpus, with its dictionary.
# Usage: scripts/fuzz.sh BUILD_DIR TARGET [libFuzzer flags, e.g. -runs=1000000 or -max_total_time=60]
# New inputs go to BUILD_DIR/fuzz/corpus/TARGET (the committed corpus is only read); a finding is
# written as BUILD_DIR/fuzz/findings/TARGET-crash-* (or -leak-, -timeout-, -oom-) and the run exits
# non-zero. The last line printed is the execution count, for docs/reliability.md.
# FUZZ_SMOKE=1 (make fuzz-smoke): start from the committed corpus only, in a working corpus
# emptied first (BUILD_DIR/fuzz/smoke/TARGET), and log to TARGET.smoke.log, so that the smoke run
# takes the same time however long the harness was fuzzed here, and leaves the long runs' files alone.
set -euo pipefail
build="$(cd "$1" && pwd)" target=$2
shift 2
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$build/fuzz/fuzz_$target"
[ -x "$bin" ] || { echo "fuzz: $bin not built (make fuzz-build)" >&2; exit 2; }
work="$build/fuzz/corpus/$target" log="$build/fuzz/$target.log"
if [ "${FUZZ_SMOKE:-0}" = 1 ]; then
  work="$build/fuzz/smoke/$target" log="$build/fuzz/$target.smoke.log"
  rm -rf "$work"
fi
findings="$build/fuzz/findings"
mkdir -p "$work" "$findings"
dict=()
[ -f "$root/tests/fuzz/dict/$target.dict" ] && dict=(-dict="$root/tests/fuzz/dict/$target.dict")
# One OpenMP thread: the tokenizer and the data pipeline parallelize with OpenMP, and a second thread
# spinning in libomp's barrier took 40 % of a jsonl run's time (and a second core) for no coverage.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# 10 s per input is a hang; 2 GiB of RSS or one allocation of 1 GiB is an out-of-memory.
set +e
(cd "$build/fuzz" && ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 \
  "./fuzz_$target" "${dict[@]}" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 \
  -artifact_prefix="$findings/$target-" "$@" "$work" "$root/tests/fuzz/corpus/$target") >"$log" 2>&1
rc=$?
set -e
execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
echo "fuzz $target: exit $rc, ${execs:-?} executions (log: $log)"
[ $rc -eq 0 ] || tail -40 "$log" >&2
exit $rc
