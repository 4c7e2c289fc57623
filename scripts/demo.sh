#!/usr/bin/env bash
# `make demo`: the main job on the embedded default model, then where the results are.
set -euo pipefail
BUILD_DIR=${1:-build}
OUT=${DEMO_DIR:-runs/demo}
mkdir -p "$OUT"
"$BUILD_DIR/scalelab" train --model llama-small --seq-len 256 --micro-batch-size 4 --max-steps 10 \
  --json "$OUT/run.json"
echo
echo "Results: $OUT/run.json (the run record: config, losses, tokens/s, memory)"
