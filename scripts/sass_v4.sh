#!/usr/bin/env bash
# On the GPU host: the SASS of fused v4's kernels in BINARY (cuobjdump from
# the host's CUDA), one file per kernel instance under DIR, and a count of
# the instructions that show how the wgmma pipeline was scheduled.
#   scripts/sass_v4.sh STAGE_DIR/bin/rvd_bench_gpu $OUT/sass
set -euo pipefail
bin=$1 dir=$2
source "$(dirname "$0")/common.sh"
rvd_outside_source "$dir" || exit 1
mkdir -p "$dir"
cuobjdump=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
"$cuobjdump" -sass "$bin" | awk -v dir="$dir" '
  /Function : .*FusedV4Kernel/ { f = dir "/" $3 ".sass"; next }
  /Function : / { f = "" }
  f != "" { print > f }'
for f in "$dir"/*.sass; do
  printf '%s HGMMA=%s DEPBAR=%s ARRIVE=%s FADD=%s FFMA=%s BAR=%s\n' "$(basename "$f")" \
    "$(grep -c HGMMA "$f")" "$(grep -c 'WARPGROUP.DEPBAR' "$f")" \
    "$(grep -c 'WARPGROUP.ARRIVE' "$f")" "$(grep -c ' FADD' "$f")" \
    "$(grep -c ' FFMA' "$f")" "$(grep -c ' BAR.SYNC' "$f")"
done
tar czf "$dir.tgz" -C "$(dirname "$dir")" "$(basename "$dir")" && rm -r "$dir"
