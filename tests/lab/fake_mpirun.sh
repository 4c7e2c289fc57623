#!/bin/sh
# A stand-in for Open MPI's `mpirun -np N PROGRAM ARGS...` in the lab's tests: runs PROGRAM N
# times one after the other, each with OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE set; exits
# with the first non-zero code.
n=1
while [ $# -gt 0 ]; do
  case "$1" in
  -np | -n) n=$2; shift 2 ;;
  -*) shift ;;
  *) break ;;
  esac
done
rc=0
i=0
while [ "$i" -lt "$n" ]; do
  OMPI_COMM_WORLD_RANK=$i OMPI_COMM_WORLD_SIZE=$n "$@"
  c=$?
  if [ "$c" -ne 0 ] && [ "$rc" -eq 0 ]; then rc=$c; fi
  i=$((i + 1))
done
exit "$rc"
