#!/usr/bin/env bash
# Collects the shared-library closure of the built binaries and modules
# (build/bin/*, build/lib/*.so) into build/gpu-libs, so that a tree built on
# Debian 12 runs on the GPU host (Ubuntu 24.04, see shared/GPU.md).
# Left out: glibc (the host's is newer and must be used), libstdc++ and
# libgcc_s (likewise), and every CUDA library (the host has CUDA 13; cuBLAS
# alone is hundreds of MB).
#
# Usage: scripts/bundle_libs.sh [BUILD_DIR]   (default: build)
set -euo pipefail
build="${1:-build}"
out="$build/gpu-libs"
mkdir -p "$out"

skip='^(libc|libm|libpthread|libdl|librt|libutil|libresolv|ld-linux[^ ]*|linux-vdso|libstdc\+\+|libgcc_s|libcuda|libcublas|libcublasLt|libcusolver|libcusparse|libcudart|libnvrtc|libnvJitLink|libcufft|libcurand|libnvidia[^ ]*)(\.so.*)?$'

shopt -s nullglob
targets=("$build"/bin/* "$build"/lib/*.so)
declare -A seen=()
for t in "${targets[@]}"; do
  [[ -f "$t" && -x "$t" || "$t" == *.so ]] || continue
  file -b "$t" | grep -q ELF || continue
  # ldd prints "name => path (addr)"; unresolved CUDA libs print "not found"
  # here when the dev box lacks them, which is fine: the host has them.
  while read -r name _ path _; do
    [[ "$path" == /* ]] || continue
    base="$(basename "$name")"
    if [[ "$base" =~ $skip ]]; then continue; fi
    [[ -n "${seen[$base]:-}" ]] && continue
    seen[$base]=1
    cp -L "$path" "$out/$base"
  done < <(ldd "$t" 2>/dev/null | grep '=>' || true)
done
echo "bundled ${#seen[@]} libraries into $out ($(du -sh "$out" | cut -f1))"
