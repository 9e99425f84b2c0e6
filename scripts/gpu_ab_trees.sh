#!/usr/bin/env bash
# Runs ON the GPU host: two staged builds (scripts/gpu_stage.sh) side by
# side in one call, so that a change is judged against the tree before it
# on the same card at the same time:
#   1. each build's GPU tests: cuda_engine_test, and tests/gpu through rvctl
#      (the tests are read from each stage's own tests/ copy when it has one,
#      so an old build can be run against a new test: a test must fail on
#      the code it was written to catch);
#   2. rvd_bench_gpu --quick of A, B, A, B (interleaved; the spread between
#      a build's two runs is the noise any difference is judged against).
# Usage: scripts/gpu_ab_trees.sh A.tgz B.tgz [OUT]   (OUT default: gpu-ab-out,
# beside A.tgz; nothing is written into the repository)
# RVD_AB_FILTER, RVD_AB_PYTEST_K: a gtest filter and a pytest -k expression
# for the A build's tests (default: all; RVD_AB_FILTER=none skips them).
# RVD_AB_ROUNDS: how many A, B pairs of benchmark runs (default 2).
set -uo pipefail
a_src="${1:?usage: gpu_ab_trees.sh A.tgz B.tgz [OUT]}"
b_src="${2:?usage: gpu_ab_trees.sh A.tgz B.tgz [OUT]}"
out="${3:-$(dirname "$a_src")/gpu-ab-out}"
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$out"
unpack() {  # unpack TGZ: prints the stage folder
  local dir
  dir="$(mktemp -d)"
  tar xzf "$1" -C "$dir" || return 1
  find "$dir" -mindepth 1 -maxdepth 1 -type d | head -n 1
}
a="$(unpack "$a_src")" || exit 1
b="$(unpack "$b_src")" || exit 1
cuda_lib=/usr/local/cuda/lib64
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
rc=0
tests() {  # tests NAME STAGE [GTEST_FILTER] [PYTEST_K]
  local name=$1 stage=$2 filter=${3:-*} k=${4:-}
  local tdir="$root/tests/gpu"
  [[ -d "$stage/tests/gpu" ]] && tdir="$stage/tests/gpu"
  echo "== $name: cuda_engine_test ($filter)"
  LD_LIBRARY_PATH="$stage/gpu-libs:$cuda_lib" timeout 240 \
    "$stage/bin/cuda_engine_test" --gtest_filter="$filter" > "$out/$name.cuda_engine_test.log" 2>&1
  echo "   exit $?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$out/$name.cuda_engine_test.log" | head -20
  for t in "$stage"/bin/cuda_*_test; do  # the other GPU test binaries
    t="$(basename "$t")"
    [[ $t == cuda_engine_test ]] && continue
    echo "== $name: $t"
    LD_LIBRARY_PATH="$stage/gpu-libs:$cuda_lib" timeout 120 \
      "$stage/bin/$t" > "$out/$name.$t.log" 2>&1
    echo "   exit $?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$out/$name.$t.log" | head -10
  done
  echo "== $name: tests/gpu through rvctl"
  LD_LIBRARY_PATH="$stage/gpu-libs:$cuda_lib" RVD_BUILD_DIR="$stage" timeout 300 \
    python3 -m pytest -q -p no:cacheprovider ${k:+-k "$k"} "$tdir" > "$out/$name.integration_gpu.log" 2>&1
  echo "   exit $?"; tail -n 3 "$out/$name.integration_gpu.log"
}
[[ "${RVD_AB_FILTER:-}" == none ]] || tests A "$a" "${RVD_AB_FILTER:-*}" "${RVD_AB_PYTEST_K:-}"
tests B "$b"
runs=()
for ((i = 1; i <= ${RVD_AB_ROUNDS:-2}; i++)); do runs+=("A$i" "B$i"); done
for run in "${runs[@]}"; do
  stage=$a; [[ $run == B* ]] && stage=$b
  echo "== bench $run"
  LD_LIBRARY_PATH="$stage/gpu-libs:$cuda_lib" timeout 200 \
    "$stage/bin/rvd_bench_gpu" --quick --json "$out/bench_$run.json" > "$out/bench_$run.log" 2>&1 || rc=1
  sed -n '/isolated_ms/,/targets met/p' "$out/bench_$run.log"
done
tar czf "$out/logs.tgz" -C "$out" $(cd "$out" && ls *.log) && rm -f "$out"/*.log
exit $rc
