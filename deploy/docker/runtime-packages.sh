#!/usr/bin/env bash
# Prints the packages (one a line, sorted) that own the shared libraries
# the given ELF files load, as resolved on this machine: the runtime
# packages of what was built with the Makefile's DEBIAN_PACKAGES, so that
# the Dockerfile's runtime stage names no package itself.
#   deploy/docker/runtime-packages.sh build/bin/rvd build/bin/rvctl build/lib/librvd_cuda.so
# A library that ldd cannot resolve (libcuda.so.1: the NVIDIA container
# toolkit mounts the driver's at run time) or that no package owns (one
# built here) is reported on stderr and left out.
set -euo pipefail
[[ $# -gt 0 ]] || { echo "usage: $0 ELF..." >&2; exit 2; }
declare -A libs=()
for f in "$@"; do
  [[ -f "$f" ]] || { echo "$0: $f: no such file" >&2; exit 1; }
  while read -r name arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    if [[ "$path" != /* ]]; then
      echo "$0: $f: $name not resolved here (left out)" >&2
      continue
    fi
    libs[$path]=1
  done < <(ldd "$f")
done
[[ ${#libs[@]} -gt 0 ]] || exit 0
# dpkg knows a file by the path its package installed it under; with a
# merged /usr, /lib/x86_64-linux-gnu/x may be registered as
# /usr/lib/x86_64-linux-gnu/x or the other way round, and ldd may name a
# symlink: ask for every spelling at once (one dpkg-query: it reads every
# package's file list per call).
declare -A spelling=()
for lib in "${!libs[@]}"; do
  real=$(readlink -f "$lib")
  for c in "$lib" "$real" "/usr$lib" "/usr$real" "${lib#/usr}" "${real#/usr}"; do
    spelling[$c]=$lib
  done
done
declare -A owner=()
while IFS= read -r line; do
  pkg=${line%%: *}
  file=${line#*: }
  [[ -n "${spelling[$file]:-}" ]] && owner[${spelling[$file]}]=${pkg%%:*}
done < <(dpkg-query -S "${!spelling[@]}" 2>/dev/null || true)
declare -A pkgs=()
for lib in "${!libs[@]}"; do
  if [[ -z "${owner[$lib]:-}" ]]; then
    echo "$0: $lib belongs to no package (left out)" >&2
    continue
  fi
  pkgs[${owner[$lib]}]=1
done
printf '%s\n' "${!pkgs[@]}" | sort
