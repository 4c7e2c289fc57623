#!/usr/bin/env bash
# Runs a command (ctest, a test binary) with the sanitizer options of `make sanitize`: every
# report is fatal, leaks are checked at exit with OpenMPI's own suppressed (lsan.supp says why,
# entry by entry), and UBSan prints the stack. Child processes (the scalelab binary the CLI
# tests start, mpirun's ranks) inherit the same options.
here="$(cd "$(dirname "$0")" && pwd)"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:detect_stack_use_after_return=0:strict_string_checks=0:check_initialization_order=1:${ASAN_OPTIONS:-}"
# (tests/sanitize/run.sh adds fast_unwind_on_malloc=0 for the tests that start MPI ranks.)
export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0:${LSAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$here/ubsan.supp:${UBSAN_OPTIONS:-}"
exec "$@"
