#!/usr/bin/env bash
# Runs each fuzz target for SECONDS on its corpus (`make fuzz`).
#   tests/fuzz/run_fuzzers.sh BUILD_DIR SECONDS [TARGET...]
# The checked-in seeds (tests/fuzz/corpus/<target>) are read, never written:
# inputs libFuzzer finds go to BUILD_DIR/fuzz-corpus/<target>, a crashing
# input to BUILD_DIR/fuzz-artifacts/, each run's log to BUILD_DIR/fuzz-logs/.
# One line per target; on a crash, the log's tail and how to replay it.
set -euo pipefail
build=$1
seconds=$2
shift 2
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_safetensors fuzz_model_loader fuzz_measure_header fuzz_alert_rules)
src=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$build/fuzz-artifacts" "$build/fuzz-logs"
# One OpenBLAS thread: the engine's calls are tiny, and threads add noise.
export OPENBLAS_NUM_THREADS=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for t in "${targets[@]}"; do
  corpus=$build/fuzz-corpus/$t
  log=$build/fuzz-logs/$t.log
  mkdir -p "$corpus"
  if "$build/bin/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
       -print_final_stats=1 -dict="$src/$t.dict" \
       -artifact_prefix="$build/fuzz-artifacts/$t-" \
       "$corpus" "$src/corpus/$t" > "$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "$t: ${seconds}s, $runs inputs, $cov, no crash ($(grep -m1 -o 'Seed: [0-9]*' "$log"))"
  else
    echo "$t: FAILED (log: $log)"
    tail -n 60 "$log"
    echo "replay: $build/bin/$t $build/fuzz-artifacts/$t-<input> (listed above)"
    exit 1
  fi
done
