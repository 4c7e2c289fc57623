#!/usr/bin/env bash
# `make sanitize`'s test run, in a build directory configured with SCALELAB_SANITIZE=ON:
#   tests/sanitize/run.sh [ctest args]     (from the build directory)
# The tests that start MPI ranks run second, with LeakSanitizer's slow DWARF unwinder: the fast
# frame-pointer unwinder stops at the first frame of OpenMPI (built without frame pointers),
# leaving "<unknown module>" stacks that no suppression can match. Everything else runs with the
# fast one (the slow one on every allocation would multiply the suite's time many times).
here="$(cd "$(dirname "$0")" && pwd)"
# (ReportInBrowser.ScaleStudyCostChart runs `scale --ranks 1,2`, which starts mpirun.)
# (Cases/DpoMpi*: the DPO tests over mpirun ranks, parameterized.)
mpi='^(MpiJob|TrainMpi|dist)\.|^Cases/DpoMpi|^ReportInBrowser\.ScaleStudyCostChart$'
"$here/env.sh" ctest --output-on-failure -E "$mpi" "$@"
rc=$?
LSAN_OPTIONS="fast_unwind_on_malloc=0" "$here/env.sh" ctest --output-on-failure -R "$mpi" "$@"
rc2=$?
[ $rc -eq 0 ] && [ $rc2 -eq 0 ]
