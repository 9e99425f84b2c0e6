#!/usr/bin/env bash
# On the GPU host (Firecracker hosts only: gVisor hides the counters): ncu's
# sections for fused v4's launches on the --ab cases (rvd_bench_gpu --ncu),
# as CSV under DIR, packed into DIR.tgz (a device call returns few files):
#   details.csv, raw.csv   throughput, pipes, warp states per launch
#   source.csv             stall samples per SASS instruction (live v4 only)
#   scripts/ncu_v4.sh STAGE_DIR/bin/rvd_bench_gpu $OUT/ncu
# --clock-control none: the device's clocks are left alone (METHOD.md).
set -uo pipefail
bin=$1 dir=$2
source "$(dirname "$0")/common.sh"
rvd_outside_source "$dir" || exit 1
mkdir -p "$dir"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -n 1)
"$ncu" --clock-control none -k regex:FusedV4Kernel --import-source no \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats --section LaunchStats \
  -o "$dir/v4" "$bin" --ncu &&
  "$ncu" -i "$dir/v4.ncu-rep" --page details --csv > "$dir/details.csv" &&
  "$ncu" -i "$dir/v4.ncu-rep" --page raw --csv > "$dir/raw.csv"
status=$?
"$ncu" --clock-control none --kernel-name-base demangled \
  -k "regex:fused_v4::FusedV4Kernel" --section SourceCounters \
  --import-source no -o "$dir/src" "$bin" --ncu &&
  "$ncu" -i "$dir/src.ncu-rep" --page source --csv --print-source sass > "$dir/source.csv" ||
  status=1
rm -f "$dir"/*.ncu-rep
tar czf "$dir.tgz" -C "$(dirname "$dir")" "$(basename "$dir")" && rm -r "$dir"
exit $status
