# Sourced by the scripts in this folder (not run on its own).

# The repository's root: the folder above this file's.
RVD_SOURCE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"

# rvd_outside_source PATH: succeeds when PATH lies outside the source tree,
# or inside it where git ignores it (a build directory such as build-cuda/);
# else says so on stderr and fails. Scripts write only there: a script that
# writes into the tracked tree or .git leaves files that someone commits.
rvd_outside_source() {
  local path rel
  path="$(realpath -m -- "$1")"
  [[ "$path" == "$RVD_SOURCE_ROOT" || "$path" == "$RVD_SOURCE_ROOT"/* ]] || return 0
  rel="${path#"$RVD_SOURCE_ROOT"}"
  rel="${rel#/}"
  if [[ -n "$rel" && "$rel" != .git && "$rel" != .git/* ]] &&
     git -C "$RVD_SOURCE_ROOT" check-ignore -q -- "$rel" 2>/dev/null; then
    return 0
  fi
  echo "$(basename "$0"): $1 is in the source tree and not git-ignored;" \
       "give a build directory (e.g. build-cuda/) or a path outside the tree" >&2
  return 1
}
