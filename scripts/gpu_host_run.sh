#!/usr/bin/env bash
# Runs ON the GPU host (the H200, Ubuntu 24.04) in a copy of the
# repository, with a build staged by scripts/gpu_stage.sh (docs/BENCHMARKING.md):
#   scripts/gpu_host_run.sh build-cuda/gpu-stage.tgz   # or the unpacked folder
# A .tgz is unpacked into a temporary folder. Everything side by side in one
# call, logs and JSON under $OUT (default: gpu-out/ beside the stage folder;
# nothing is written into the repository):
#   env.txt                   nvidia-smi, library resolution of the module
#   cuda_engine_test.log      the CUDA engine's GPU tests (ctest label gpu)
#   cuda_device_lost_test.log a sticky device error, in its own process
#   cuda_*_test.log           every other staged GPU test binary
#   integration_gpu.log       rvd + librvd_cuda.so driven by rvctl (label gpu)
#   python_gpu.log            the Python client's GPU tests (tests/python/gpu)
#   gpu_bench.{json,log}      rvd_bench_gpu: validation, then timings
#   gpu_ab.{json,log}         rvd_bench_gpu --ab: fused v3 and v4 side by side
#   e2e_gpu.{json,log}        a copy-mode measurement through the daemon
#   torch_peers.{json,log}    the PyTorch peers (bench/torch_peers.py)
#   live_train.{json,md,log}  bench/live_train.py: RVMonitor over IPC in a
#                             real training loop (issue 15's goals and proof)
#   ncu.tgz                   ncu's sections for v4 on the --ab cases
#                             (rvd_bench_gpu --ncu): details.csv, raw.csv
#   sustain.{json,log}        rvd_bench_gpu --sustain: queued vs spaced launches
#   sustain_clocks.txt        the same against smi.csv (bench/smi_align.py)
#   smi.csv                   nvidia-smi every 50 ms for the whole call: SM
#                             clock, power, temperature, clock-event reasons
# The logs, ncu.tgz and anything else but the JSON files are then packed
# into logs.tgz: a device call returns at most 8 files.
# Exit status: non-zero if any step failed (every step still runs).
# RVD_STEPS="cuda_engine_test gpu_ab" runs only the steps named.
set -uo pipefail
source "$(dirname "$0")/common.sh"
src="${1:?usage: scripts/gpu_host_run.sh STAGE.tgz | STAGE_DIR}"
if [[ "$src" == *.tgz ]]; then
  unpacked="$(mktemp -d)"
  tar xzf "$src" -C "$unpacked" || exit 1
  stage="$(find "$unpacked" -mindepth 1 -maxdepth 1 -type d | head -n 1)"
else
  stage="$(realpath "$src")"
fi
[[ -x "$stage/bin/rvd_bench_gpu" ]] || { echo "$0: $src is not a staged build" >&2; exit 1; }
OUT="${OUT:-$(dirname "$stage")/gpu-out}"
rvd_outside_source "$OUT" || exit 1
mkdir -p "$OUT"
echo "stage $stage; logs and JSON under $OUT"
cd "$RVD_SOURCE_ROOT" || exit 1  # tests/gpu and bench/ are read from here

cuda_lib=""
for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  if [[ -e "$d/libcublas.so.13" || -e "$d/libcublas.so" ]]; then cuda_lib="$d"; break; fi
done
if [[ -z "$cuda_lib" ]]; then
  p="$(ldconfig -p 2>/dev/null | awk '/libcublas\.so/ {print $NF; exit}')"
  [[ -n "$p" ]] && cuda_lib="$(dirname "$p")"
fi
export LD_LIBRARY_PATH="$stage/gpu-libs${cuda_lib:+:$cuda_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# No __pycache__ in the repository's folders.
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 RVD_BUILD_DIR="$stage"

{
  date -u
  nvidia-smi || true
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd "$stage/lib/librvd_cuda.so" 2>&1 | grep -E "not found|cublas|cusolver" || true
} > "$OUT/env.txt" 2>&1

# Clocks and power through the whole call, to place the timings against.
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active \
  --format=csv -lms 50 > "$OUT/smi.csv" 2>&1 &
smi_pid=$!

rc=0
step() {  # step NAME TIMEOUT_S COMMAND...: runs, logs to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  [[ -z "${RVD_STEPS:-}" || " $RVD_STEPS " == *" $name "* ]] || return 0
  echo "== $name"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local status=$?
  tail -n 4 "$OUT/$name.log"
  [[ $status -eq 0 ]] || { echo "!! $name failed ($status)"; rc=1; }
}
# Limits about 2-3x each step's usual time: a hung kernel costs device time
# (gpu_bench: ~60 s, s5-7; 190 s before the stats kernel was fixed).
step cuda_engine_test 90 "$stage/bin/cuda_engine_test"
step cuda_device_lost_test 30 "$stage/bin/cuda_device_lost_test"
# Every other GPU test binary gpu_stage.sh staged (ctest label gpu).
for t in "$stage"/bin/cuda_*_test; do
  name="$(basename "$t")"
  [[ "$name" == cuda_engine_test || "$name" == cuda_device_lost_test ]] && continue
  step "$name" 120 "$t"
done
step integration_gpu 120 python3 -m pytest -q -p no:cacheprovider tests/gpu
step python_gpu 300 env PYTHONPATH="$RVD_SOURCE_ROOT/client/python:$stage/python" \
  python3 -m pytest -q -p no:cacheprovider tests/python/gpu
step gpu_bench 300 "$stage/bin/rvd_bench_gpu" --json "$OUT/gpu_bench.json"
# RVD_AB_ARGS replaces --ab's defaults, e.g. "--reps 20 --case 32x1024x4096:f32".
step gpu_ab 300 "$stage/bin/rvd_bench_gpu" --ab ${RVD_AB_ARGS:---reps 30} --json "$OUT/gpu_ab.json"
step sustain 120 "$stage/bin/rvd_bench_gpu" --sustain --json "$OUT/sustain.json"
step e2e_gpu 120 python3 bench/e2e_gpu.py --rounds 5
step ncu 300 scripts/ncu_v4.sh "$stage/bin/rvd_bench_gpu" "$OUT/ncu"
# Issue 15's training loop over IPC (~2-3 min per dtype); RVD_LIVE_ARGS adds
# bench/live_train.py's options, e.g. "--dtypes bf16".
step live_train 540 python3 bench/live_train.py --rvd "$stage/bin/rvd" --out "$OUT" ${RVD_LIVE_ARGS:-}
step torch_peers 180 bash -c "python3 bench/torch_peers.py > '$OUT/torch_peers.json'"
kill "$smi_pid" 2>/dev/null
[[ -f "$OUT/sustain.json" ]] &&
  python3 bench/smi_align.py "$OUT/sustain.json" "$OUT/smi.csv" | tee "$OUT/sustain_clocks.txt"
cat "$OUT/torch_peers.json" 2>/dev/null
[[ -f "$OUT/e2e_gpu.log" ]] && grep -h '^{' "$OUT/e2e_gpu.log" > "$OUT/e2e_gpu.json"
(cd "$OUT" && find . -maxdepth 1 -type f ! -name '*.json' ! -name logs.tgz -printf '%f\n' |
  tar czf logs.tgz -T - --remove-files)
exit $rc
