#!/usr/bin/env bash
# A CUDA compiler launcher (CMAKE_CUDA_COMPILER_LAUNCHER): runs the compile
# command it is given and drops ptxas's advisory C7519 lines from its
# stderr ("warpgroup.arrive is injected ... to allow use of registers in
# GMMA"). ptxas prints one per wgmma site of every 16-bit fused v4
# instantiation (about 260 lines per build), has no option to silence
# them, and -w does not (they are "info", not warnings); the code it
# generates is what it would be without the message. Every other line,
# warnings and errors included, passes through, and the exit status is the
# compiler's.
#   nvcc_quiet.sh nvcc ARGS...
set -uo pipefail
# stdout goes straight to fd 3; stderr through the filter (grep's own
# status, 1 when it printed nothing, does not count).
{ "$@" 2>&1 1>&3 3>&- | { grep -v '^ptxas info    : (C7519) ' >&2 || true; }; } 3>&1
