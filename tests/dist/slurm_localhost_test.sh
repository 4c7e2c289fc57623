#!/usr/bin/env bash
# CTest: starts a real SLURM cluster on this machine (scripts/slurm-localhost.sh), submits a
# two-task MPI job through src/lab/slurm (the slurm_submit driver), checks the collected results,
# and stops the cluster whatever happens. Exit 77 (skipped) where it cannot run (not root, no
# slurm-wlm/munge), except under CI=true, where that is a failure: CI must run it.
# Usage: slurm_localhost_test.sh SOURCE_DIR SLURM_SUBMIT_BINARY RANK_RESULT_BINARY
set -uo pipefail
SRC=$1 DRIVER=$2 RANK_RESULT=$3

missing=""
[ "$(id -u)" -eq 0 ] || missing="root"
for b in slurmctld slurmd munged sbatch srun; do command -v "$b" >/dev/null || missing="$missing $b"; done
if [ -n "$missing" ]; then
  if [ "${CI:-}" = true ]; then echo "slurm test: missing in CI: $missing (scripts/deps.sh installs slurm-wlm munge)" >&2; exit 1; fi
  echo "slurm test: skipped, missing: $missing (install slurm-wlm munge via scripts/deps.sh and run as root)"
  exit 77
fi

T=$(mktemp -d /tmp/scalelab-slurm-test.XXXXXX)
chmod 755 "$T"
export SCALELAB_SLURM_DIR=$T/cluster
# Ports of our own, so that another cluster on this machine does not collide with this one.
export SCALELAB_SLURMCTLD_PORT=$((20000 + ($$ % 10000) * 2))
export SCALELAB_SLURMD_PORT=$((SCALELAB_SLURMCTLD_PORT + 1))
cleanup() { "$SRC/scripts/slurm-localhost.sh" stop; rm -rf "$T"; }
trap cleanup EXIT

"$SRC/scripts/slurm-localhost.sh" start >/dev/null || exit 1
export SLURM_CONF=$SCALELAB_SLURM_DIR/slurm.conf
"$DRIVER" "$RANK_RESULT" "$T/job"
