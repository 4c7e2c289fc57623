#!/usr/bin/env bash
# CTest: starts a real SLURM cluster on this machine (scripts/slurm-localhost.sh), submits a
# two-task MPI job through src/lab/slurm (the slurm_submit driver) and checks the collected
# results; then runs `scalelab scale --launcher slurm --ranks 2`, which submits a two-task job
# (srun --mpi=pmix scalelab train) and records its result in a results database, and checks the
# database. The cluster is stopped whatever happens. Exit 77 (skipped) where it cannot run (not
# root, no slurm-wlm/munge), except under CI=true, where that is a failure: CI must run it.
# Usage: slurm_localhost_test.sh SOURCE_DIR SLURM_SUBMIT_BINARY RANK_RESULT_BINARY SCALELAB_BINARY
set -uo pipefail
SRC=$1 DRIVER=$2 RANK_RESULT=$3 SCALELAB=$4

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
"$DRIVER" "$RANK_RESULT" "$T/job" || exit 1

# The scaling study on SLURM: one trial of 2 ranks, its run record written by rank 0 of the job.
echo "--- scalelab scale --launcher slurm --ranks 2"
DB=$T/results/scalelab.db
OMP_NUM_THREADS=1 timeout -k 10 200 "$SCALELAB" scale --launcher slurm --ranks 2 --db "$DB" --name slurm-scale \
  --timeout 150 --time 00:05:00 --model llama-tiny --seq-len 16 --max-steps 3 --micro-batch-size 2 --threads 1
rc=$?
for f in "$T"/results/logs/slurm-scale/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }; done
[ $rc -eq 0 ] || { echo "FAILED: scalelab scale --launcher slurm exited $rc" >&2; exit 1; }
"$SCALELAB" results --db "$DB" --sweep slurm-scale --format json >"$T/rows.json" 2>/dev/null ||
  { echo "FAILED: scalelab results could not read the study" >&2; exit 1; }
python3 - "$T/rows.json" "$T"/results/logs/slurm-scale/*.json <<'PY' || exit 1
import json, sys
rows = json.load(open(sys.argv[1]))
assert len(rows) == 1, rows
row = rows[0]
assert row["ranks"] == 2 and row["status"] == "ok" and row["runs"] == 1, row
assert row["tokens_per_s"] > 0 and row["tokens_per_s_per_device"] > 0, row
records = [json.load(open(p)) for p in sys.argv[2:]]
assert len(records) == 1, sys.argv[2:]
rec = records[0]
assert rec["status"] == "ok" and rec["world_size"] == 2 and rec["launcher"] == "slurm", rec
assert len(rec["ranks"]) == 2 and rec["data_parallel"]["backend"] == "mpi", rec
print("--- scale on SLURM: ok (%.1f tokens/s over 2 ranks, recorded in the database)" % row["tokens_per_s"])
PY
