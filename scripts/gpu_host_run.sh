#!/usr/bin/env bash
# Runs ON the GPU host (H200, Ubuntu 24.04), from the repository root, with a
# tree prebuilt on Debian 12 (build/, with build/gpu-libs from
# scripts/bundle_libs.sh). Writes everything under $OUT (default ./gpu-out):
#   ctest.log        ctest -L gpu (the CUDA engine's tests)
#   gpu_bench.json   rvd_bench_gpu --json; gpu_bench.log its table
#   torch_peers.*    bench/torch_peers.py, the PyTorch peers, same run
#   env.txt          nvidia-smi, library paths
# Exit status: non-zero if any step failed (all steps still run).
set -uo pipefail
build="${BUILD_DIR:-build}"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"

cuda_lib=""
for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  if [[ -e "$d/libcublas.so.13" || -e "$d/libcublas.so" ]]; then cuda_lib="$d"; break; fi
done
if [[ -z "$cuda_lib" ]]; then
  p="$(ldconfig -p 2>/dev/null | awk '/libcublas\.so/ {print $NF; exit}')"
  [[ -n "$p" ]] && cuda_lib="$(dirname "$p")"
fi
export LD_LIBRARY_PATH="$PWD/$build/gpu-libs${cuda_lib:+:$cuda_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

{
  date -u
  nvidia-smi || true
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd "$build/lib/librvd_cuda.so" 2>&1 | grep -E "not found|cublas|cusolver" || true
} > "$OUT/env.txt" 2>&1

rc=0
ctest --test-dir "$build" -L gpu --output-on-failure 2>&1 | tee "$OUT/ctest.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1

"$build/bin/rvd_bench_gpu" --json "$OUT/gpu_bench.json" 2>&1 | tee "$OUT/gpu_bench.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1

PYTHONUNBUFFERED=1 python3 bench/torch_peers.py > "$OUT/torch_peers.json" 2> "$OUT/torch_peers.log"
[[ $? -eq 0 ]] || rc=1
cat "$OUT/torch_peers.json"

exit $rc
