#!/usr/bin/env bash
# Stages what the GPU host needs from a Debian build into one small folder
# (default gpu-stage/, git-ignored through .git/info/exclude), laid out like
# a build directory so that tests and benchmarks take it as RVD_BUILD_DIR:
#   bin/       rvd, rvctl, cuda_engine_test, rvd_bench_gpu (stripped)
#   lib/       librvd_cuda.so (stripped)
#   python/    the generated Python stubs
#   gpu-libs/  the Debian shared-library closure (scripts/bundle_libs.sh)
# and packs it as STAGE_DIR.tgz (about 23 MB: OpenBLAS alone is 36 MB
# unpacked, and a device call carries at most 64 MiB). Then, on the GPU
# host: tar xzf gpu-stage.tgz && scripts/gpu_host_run.sh gpu-stage
#
# Usage: scripts/gpu_stage.sh [BUILD_DIR] [STAGE_DIR]
set -euo pipefail
build="${1:-build}"
stage="${2:-gpu-stage}"
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib"
for b in rvd rvctl cuda_engine_test rvd_bench_gpu; do
  strip -o "$stage/bin/$b" "$build/bin/$b"
done
strip -o "$stage/lib/librvd_cuda.so" "$build/lib/librvd_cuda.so"
cp -r "$build/python" "$stage/python"
scripts/bundle_libs.sh "$stage" >/dev/null
tar czf "$stage.tgz" "$stage"
for ignored in "/$stage/" "/$stage.tgz"; do
  grep -qxF "$ignored" .git/info/exclude 2>/dev/null || echo "$ignored" >> .git/info/exclude
done
ls -la "$stage.tgz"
