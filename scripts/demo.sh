#!/usr/bin/env bash
# `make demo`: the main job on the embedded default model: the optimization ladder of llama-small
# on this CPU under an emulated 1 GiB device, every rung recorded in the results database.
set -euo pipefail
BUILD_DIR=${1:-build}
OUT=${DEMO_DIR:-runs/demo}
mkdir -p "$OUT"
DB="$OUT/scalelab.db"
"$BUILD_DIR/scalelab" ladder --model llama-small --seq-len 256 --device-memory 1GiB \
  --max-steps 2 --bench-warmup-steps 1 --db "$DB"
echo
echo "Results: $DB (every trial, its config, metrics and log path)"
echo "  ./$BUILD_DIR/scalelab results --db $DB               # the tables again, from the database"
echo "  ./$BUILD_DIR/scalelab results --db $DB --view trials # every trial"
echo "  ./$BUILD_DIR/scalelab analyze --db $DB               # statistics over the ladder's trials"
echo
# The report of the ladder just run: one HTML file that opens offline (docs/analysis.md).
"$BUILD_DIR/scalelab" report --db "$DB" -o "$OUT/report.html" >/dev/null
echo "Report: $OUT/report.html (open it in a browser; it needs no network)"
