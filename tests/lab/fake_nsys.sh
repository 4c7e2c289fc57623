#!/bin/sh
# A stand-in for Nsight Systems' `nsys` in the lab's tests (tests copy it into a directory on PATH
# as `nsys`).
#   nsys profile -o BASE [--opt VALUE | --opt=value]... CMD ARGS...
#       prints what nsys prints around the application, runs CMD, writes BASE.nsys-rep (a
#       placeholder; %q{VAR} and %p in BASE expand as nsys expands them) and exits with CMD's code.
#   nsys stats [options] REPORT
#       prints the CSV file $FAKE_NSYS_STATS_CSV (the committed fixture), as `nsys stats --format
#       csv` prints its reports.
# Knobs: FAKE_NSYS_LOG (append each call's arguments, one call a line), FAKE_NSYS_NO_REPORT=1
# (profile writes no report), FAKE_NSYS_STATS_FAIL=1 (stats fails with a message on stderr).
if [ -n "$FAKE_NSYS_LOG" ]; then echo "$*" >>"$FAKE_NSYS_LOG"; fi
cmd=$1
shift
case "$cmd" in
profile)
  out=report1
  while [ $# -gt 0 ]; do
    case "$1" in
    -o | --output) out=$2; shift 2 ;;
    --force-overwrite | --trace | -t | --sample | -s) shift 2 ;;
    --*=* | -*) shift ;;
    *) break ;;
    esac
  done
  var=$(printf '%s' "$out" | sed -n 's/.*%q{\([A-Za-z_0-9]*\)}.*/\1/p')
  if [ -n "$var" ]; then
    value=$(eval "printf '%s' \"\${$var}\"")
    out=$(printf '%s' "$out" | sed "s/%q{$var}/$value/")
  fi
  out=$(printf '%s' "$out" | sed "s/%p/$$/")
  echo "Collecting data..."
  "$@"
  rc=$?
  echo "Generating '/tmp/nsys-report-fake.qdstrm'"
  if [ -z "$FAKE_NSYS_NO_REPORT" ]; then
    echo "fake nsys report of: $*" >"$out.nsys-rep"
    echo "[1/1] [========================100%] $(basename "$out").nsys-rep"
    echo "Generated:"
    echo "    $out.nsys-rep"
  fi
  if [ "$rc" -ne 0 ]; then echo "The target application returned non-zero exit code $rc"; fi
  exit "$rc"
  ;;
stats)
  for last in "$@"; do :; done
  if [ -n "$FAKE_NSYS_STATS_FAIL" ]; then
    echo "ERROR: $last could not be exported to SQLite (fake failure)" >&2
    exit 1
  fi
  if [ ! -f "$last" ]; then
    echo "ERROR: report file $last does not exist" >&2
    exit 1
  fi
  echo "Generating SQLite file ${last%.nsys-rep}.sqlite from $last"
  cat "$FAKE_NSYS_STATS_CSV"
  ;;
*)
  echo "fake nsys: unknown command '$cmd'" >&2
  exit 1
  ;;
esac
