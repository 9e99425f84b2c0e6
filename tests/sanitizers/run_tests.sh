#!/usr/bin/env bash
# Runs the unit and integration tests of a sanitizer build (`make asan`).
#   tests/sanitizers/run_tests.sh BUILD_DIR [ctest args...]
# Every instrumented process (test binaries, and the rvd and rvctl that the
# integration tests start) writes its ASan and LSan reports to
# BUILD_DIR/sanitizer-logs/ instead of stderr, so that a report from a
# daemon whose output no test reads, or a leak found at exit, still fails
# the run. UBSan aborts the process at its first report; GCC's UBSan
# runtime ignores log_path when ASan is linked too, so the daemons' logs
# (under pytest's --basetemp, BUILD_DIR/pytest-tmp) are searched for its
# reports as well. The suppression
# files here are for reports from Debian's uninstrumented libraries only,
# one commented entry each; none may name our code.
set -uo pipefail
build=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
logs=$(cd "$build" && pwd)/sanitizer-logs
rm -rf "$logs"
mkdir -p "$logs"
# allocator_may_return_null=1: a failed allocation returns null (operator
# new throws std::bad_alloc) as with glibc's allocator, instead of ASan
# aborting: rvd's contract is that an allocation failure on the request
# path becomes a RESOURCE_EXHAUSTED status, and the tests check that.
export ASAN_OPTIONS="log_path=$logs/asan:detect_leaks=1:check_initialization_order=1:allocator_may_return_null=1"
export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1:suppressions=$here/ubsan.supp"
export PYTEST_ADDOPTS="--basetemp=$(cd "$build" && pwd)/pytest-tmp"
ctest --test-dir "$build" --output-on-failure -LE gpu "$@"
rc=$?
# A report has an ERROR line (ASan, LSan) or a "runtime error" (UBSan);
# the warning for an allocation that returned null is not one.
failed=0
for f in $(find "$logs" -type f | sort); do
  if grep -qE 'ERROR: (Address|Leak|UndefinedBehavior)Sanitizer|runtime error:' "$f"; then
    echo "==== sanitizer report: $f"
    cat "$f"
    failed=1
  else
    echo "sanitizer note ($f): $(head -c 300 "$f")"
  fi
done
if [ -d "$build/pytest-tmp" ]; then
  for f in $(grep -rlE 'ERROR: (Address|Leak|UndefinedBehavior)Sanitizer|runtime error:' \
               "$build/pytest-tmp" --include='*.log' | sort); do
    echo "==== sanitizer report in a daemon log: $f"
    grep -E -A30 'Sanitizer|runtime error:' "$f" | head -n 80
    failed=1
  done
fi
[ $failed = 0 ] || exit 1
exit $rc
