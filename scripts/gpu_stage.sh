#!/usr/bin/env bash
# Stages what the GPU host needs from a Debian build into one small folder,
# laid out like a build directory so that tests and benchmarks take it as
# RVD_BUILD_DIR:
#   bin/       rvd, rvctl, rvd_bench_gpu and the GPU test binaries (stripped)
#   lib/       librvd_cuda.so (stripped)
#   python/    the generated Python stubs
#   gpu-libs/  the Debian shared-library closure (scripts/bundle_libs.sh)
# and packs it as STAGE_DIR.tgz (about 23 MB: OpenBLAS alone is 36 MB
# unpacked, and a device call carries at most 64 MiB), which unpacks as one
# folder named after STAGE_DIR. Then, on the GPU host, from the repository
# root: scripts/gpu_host_run.sh STAGE_DIR.tgz (docs/BENCHMARKING.md).
#
# Usage: scripts/gpu_stage.sh [BUILD_DIR] [STAGE_DIR]
#   BUILD_DIR  default build; STAGE_DIR default BUILD_DIR/gpu-stage.
# Writes STAGE_DIR and STAGE_DIR.tgz only, never the source tree: a
# STAGE_DIR there must be git-ignored (as build directories are).
set -euo pipefail
source "$(dirname "$0")/common.sh"
build="${1:-build}"
stage="${2:-$build/gpu-stage}"
stage="${stage%/}"
rvd_outside_source "$stage"
# The GPU test binaries: every test of label gpu that is a binary of ours.
gpu_tests=$(ctest --test-dir "$build" -L gpu -N 2>/dev/null |
  sed -n 's/^ *Test *#[0-9]*: \(cuda_[a-z_]*_test\)$/\1/p')
binaries="rvd rvctl rvd_bench_gpu $gpu_tests"
for b in $binaries cuda_engine_test; do
  [[ -x "$build/bin/$b" ]] || { echo "$0: $build/bin/$b missing: build it first" >&2; exit 1; }
done
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib"
for b in $binaries; do
  strip -o "$stage/bin/$b" "$build/bin/$b"
done
strip -o "$stage/lib/librvd_cuda.so" "$build/lib/librvd_cuda.so"
cp -r "$build/python" "$stage/python"
"$RVD_SOURCE_ROOT/scripts/bundle_libs.sh" "$stage" >/dev/null
tar czf "$stage.tgz" -C "$(dirname "$stage")" "$(basename "$stage")"
ls -la "$stage.tgz"
