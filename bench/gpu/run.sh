#!/usr/bin/env bash
# The one script for a call on a lent GPU machine (run from the repository root):
#
#   bench/gpu/run.sh check                 # the device, scalelab selftest --device cuda, --optimizer-in-
#                                          # backward weights = step-end weights (fp32, bf16, bf16 LoRA),
#                                          # GPU test binaries
#   bench/gpu/run.sh profile               # attention alone (PyTorch SDPA backends) and scalelab's
#                                          # train unprofiled / --profile with CUDA events + CUPTI /
#                                          # events only / synchronized scopes (PROFILE_MB, default 8)
#   bench/gpu/run.sh bench [compare args]  # the device, then bench/gpu/compare.py in the time left
#   bench/gpu/run.sh methods               # examples/finetune-methods-gpu.toml (full, LoRA, QLoRA,
#                                          # DPO, QAT, QAT + LoRA on llama-3.2-1b) through the lab,
#                                          # then the HF peers at the same settings: Trainer full and
#                                          # peft LoRA (bench/gpu/hf_benchmark.py --lora-rank 16)
#   bench/gpu/run.sh kernels-ab            # the packed/tiled kernels against their first versions
#                                          # (SCALELAB_CUDA_KERNELS=v1): llama-3.2-1b bf16 + flash +
#                                          # fused, micro-batch AB_MB (default 8), step time and the
#                                          # op-family table of --profile for each, alternating
#                                          # (AB_ROUNDS rounds, default 2)
#   bench/gpu/run.sh eager-ab              # eager attention on cuBLASLt (the default) against the first
#                                          # FMA-tile kernels (SCALELAB_CUDA_EAGER=fma): opt-1.3b bf16 micro-batch
#                                          # EAGER_OPT_MB (default 16) and llama-3.2-1b bf16 micro-batch
#                                          # EAGER_LLAMA_MB (default 8), seq 1024, step time, measured
#                                          # max reserved and `scalelab plan`'s prediction under each
#                                          # switch; EAGER_HF=1 adds the HF Trainer at the OPT setting
#   bench/gpu/run.sh next                  # what the last session left for the next one, in one call
#                                          # (~7 min): check; --optimizer-in-backward's step time and peak
#                                          # against the step-end update (llama-3.2-1b bf16 + flash, mb 8);
#                                          # the HF memory rows whose prediction is not yet exact, each
#                                          # with its allocator trace (fp32 sdpa, Liger under autocast
#                                          # with eager and with sdpa, Qwen2 + Liger, Liger at mb 16)
#   bench/gpu/run.sh versions              # the HF memory rows under older transformers releases
#                                          # (plan --transformers-version 4.44 / 4.45 / 4.55 / 4.56 / 5.0),
#                                          # each release carried as .hfv/tfNNN.tar.xz (made by
#                                          # bench/gpu/pack_transformers.py), then check
#   bench/gpu/run.sh all   [compare args]  # check, profile, then bench
#
# scalelab comes prebuilt in $SCALELAB_DEVICE_DIR (default .device/: bin/scalelab or scalelab,
# env.sh setting LD_LIBRARY_PATH, tests/* GoogleTest binaries; scripts/package-device.sh makes
# it). Without it the script tries a CMake build into build-device/ (the machine has cmake and
# nvcc but maybe not the Debian packages the build needs: then it says so and goes on without
# scalelab). Everything is logged to $OUT/run.log (OUT defaults to runs/gpu-<time>/); compare.py
# writes $OUT/compare.json and $OUT/compare.md. The summary is printed last.
#
# Environment: RUN_BUDGET_S (default 570: a 10-minute call less a margin), PROFILE_ATTENTION=0 (profile:
# skip the PyTorch attention op), PROFILE_MB (profile: micro-batch, default 8), TEST_FILTER (a
# --gtest_filter for the test binaries), TEST_TIMEOUT_S (per binary, default 240),
# SELFTEST_TIMEOUT_S (default 180), SANITIZER_TIMEOUT_S (default 100), BUILD_TIMEOUT_S (default 420), SCALELAB_NO_BUILD (set: never
# try the build), PYTHON (default python3), WHEELS_DIR (default $SCALELAB_DEVICE_DIR/wheels: pure-
# Python wheels to pip-install --no-deps first, e.g. liger-kernel and accelerate; never in git).
set -uo pipefail

mode="${1:-all}"
[ $# -gt 0 ] && shift
case "$mode" in
  check|profile|bench|methods|kernels-ab|eager-ab|next|versions|all) ;;
  -h|--help|help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  *) echo "run.sh: unknown mode '$mode' (check | profile | bench [compare args] | methods | all [compare args])" >&2; exit 2 ;;
esac

OUT="${OUT:-runs/gpu-$(date +%Y%m%d-%H%M%S)}"
export OUT
mkdir -p "$OUT"
LOG="$OUT/run.log"
BUDGET="${RUN_BUDGET_S:-570}"
PY="${PYTHON:-python3}"
DEV_DIR="${SCALELAB_DEVICE_DIR:-.device}"
SUMMARY=()
STATUS=0

say() { printf '%s\n' "$*"; }
section() { printf '\n==== %s (t=%ss)\n' "$*" "$SECONDS"; }
add() { SUMMARY+=("$*"); }
left() { echo $((BUDGET - SECONDS)); }

device_info() {
  section "device"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L
    nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.max.sm,power.limit \
      --format=csv 2>/dev/null || true
    add "device: $(nvidia-smi -L 2>/dev/null | head -1)"
  else
    say "nvidia-smi: not found"
    add "device: nvidia-smi not found"
  fi
  say "host: $(nproc) cores, $(free -g 2>/dev/null | awk '/Mem:/{print $2}') GiB; $(uname -r)"
  command -v nvcc >/dev/null 2>&1 && nvcc --version | tail -2
  install_wheels
  "$PY" - <<'EOF' || true
import importlib, sys
print("python", sys.version.split()[0])
for name in ("torch", "transformers", "accelerate", "liger_kernel", "triton", "flash_attn"):
    try:
        m = importlib.import_module(name)
        extra = ""
        if name == "torch":
            extra = f" (CUDA {m.version.cuda}, cuda available {m.cuda.is_available()})"
        print(f"{name} {getattr(m, '__version__', '?')}{extra}")
    except Exception as e:  # noqa: BLE001
        print(f"{name}: not importable ({type(e).__name__}: {str(e)[:120]})")
EOF
  local v
  v=$("$PY" -c 'import torch, transformers; print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}")' 2>/dev/null) \
    || v="torch/transformers not importable"
  add "python: $v"
}

# Pure-Python wheels carried with the call (the machine has no network), e.g. liger-kernel and
# accelerate: $WHEELS_DIR (default $DEV_DIR/wheels/) *.whl, installed without dependencies.
install_wheels() {
  local dir="${WHEELS_DIR:-$DEV_DIR/wheels}" whl=()
  [ -d "$dir" ] || return 0
  shopt -s nullglob
  whl=("$dir"/*.whl)
  shopt -u nullglob
  [ "${#whl[@]}" -gt 0 ] || return 0
  say "installing ${#whl[@]} carried wheel(s) from $dir: $(basename -a "${whl[@]}" | tr '\n' ' ')"
  if PIP_BREAK_SYSTEM_PACKAGES=1 "$PY" -m pip install --quiet --no-deps --no-index --disable-pip-version-check \
       "${whl[@]}" 2>&1 | tail -5; then
    add "wheels: installed $(basename -a "${whl[@]}" | tr '\n' ' ')"
  else
    add "wheels: pip install failed (see run.log)"
  fi
}

SL=""
find_scalelab() {
  section "scalelab"
  if [ -f "$DEV_DIR/env.sh" ]; then
    # shellcheck disable=SC1091
    . "$DEV_DIR/env.sh"
    say "sourced $DEV_DIR/env.sh (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"
  fi
  local c
  for c in "${SCALELAB_BIN:-}" "$DEV_DIR/bin/scalelab" "$DEV_DIR/scalelab" build-device/scalelab; do
    if [ -n "$c" ] && [ -x "$c" ]; then SL="$c"; break; fi
  done
  if [ -z "$SL" ] && [ -n "${SCALELAB_NO_BUILD:-}" ]; then
    say "no prebuilt scalelab in $DEV_DIR/ (SCALELAB_NO_BUILD: not building)"
    add "scalelab: none (no $DEV_DIR/, SCALELAB_NO_BUILD set)"
  elif [ -z "$SL" ]; then
    say "no prebuilt scalelab in $DEV_DIR/; trying a build into build-device/"
    try_build
  fi
  if [ -n "$SL" ]; then
    if ldd "$SL" 2>/dev/null | grep -q "not found"; then
      say "scalelab: missing shared libraries:"
      ldd "$SL" | grep "not found"
      add "scalelab: $SL cannot load: $(ldd "$SL" | grep 'not found' | awk '{print $1}' | tr '\n' ' ')"
      SL=""
      STATUS=1
      return
    fi
    say "scalelab: $SL"
    "$SL" version 2>&1 | head -5
    add "scalelab: $SL ($("$SL" version 2>&1 | head -1))"
    export SCALELAB_BIN="$SL"
  fi
}

try_build() {
  local nvcc=""
  if command -v nvcc >/dev/null 2>&1; then nvcc=$(command -v nvcc)
  elif [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
  if ! command -v cmake >/dev/null 2>&1 || [ -z "$nvcc" ]; then
    say "cannot build: cmake or nvcc missing"
    add "scalelab: none (no $DEV_DIR/, and no cmake/nvcc to build)"
    return
  fi
  local gen=() jobs
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  jobs=$(nproc)
  if ! timeout 120 cmake -S . -B build-device "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
       -DCMAKE_CUDA_COMPILER="$nvcc" -DSCALELAB_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
       >"$OUT/build.log" 2>&1; then
    say "cannot build here: CMake configure failed (the Debian packages scalelab builds against are not on this machine):"
    grep -E "Could NOT find|not found|Error" "$OUT/build.log" | head -8
    add "scalelab: none (no $DEV_DIR/; configure failed here, see build.log: $(grep -m1 -E 'Could NOT find|Error' "$OUT/build.log" | cut -c1-120))"
    return
  fi
  local bt=$(( $(left) - 120 ))
  [ "$bt" -gt "${BUILD_TIMEOUT_S:-420}" ] && bt="${BUILD_TIMEOUT_S:-420}"
  if [ "$bt" -lt 60 ]; then
    add "scalelab: none (configured, but no time left to build)"
    return
  fi
  say "building scalelab (at most ${bt}s, $jobs jobs)"
  if timeout "$bt" cmake --build build-device -j "$jobs" --target scalelab >>"$OUT/build.log" 2>&1 \
     && [ -x build-device/scalelab ]; then
    SL=build-device/scalelab
  else
    say "build failed or timed out: tail of build.log:"
    tail -15 "$OUT/build.log"
    add "scalelab: none (build failed or timed out, see build.log)"
  fi
}

# The attention selftest family under another kernel switch: selftest_attention_with VAR=VALUE
# "section title" "summary label" LOGFILE
selftest_attention_with() {
  section "selftest of $2 ($1)"
  env "$1" timeout 60 "$SL" selftest --device cuda --filter '^attention/' >"$OUT/$4" 2>&1
  local rc=$?
  tail -1 "$OUT/$4"
  add "selftest attention, $3: exit $rc: $(tail -1 "$OUT/$4")"
  [ "$rc" -ne 0 ] && STATUS=1
}

run_checks() {
  section "scalelab selftest --device cuda"
  if [ -z "$SL" ]; then
    say "skipped: no scalelab"
    add "selftest: skipped (no scalelab)"
  else
    local rc out="$OUT/selftest.log"
    timeout "${SELFTEST_TIMEOUT_S:-180}" "$SL" selftest --device cuda >"$out" 2>&1
    rc=$?
    tail -60 "$out"
    if [ "$rc" -eq 0 ]; then
      add "selftest: passed (exit 0): $(grep -v '^[[:space:]]*$' "$out" | tail -1 | cut -c1-160)"
    elif grep -qiE "requires a subcommand|not found|unknown|extras" "$out" && ! grep -qi "fail" "$out"; then
      add "selftest: this scalelab has no 'selftest' subcommand (exit $rc)"
    else
      add "selftest: FAILED (exit $rc; $(grep -ciE 'fail' "$out") failing lines, see selftest.log)"
      STATUS=1
      isolate_selftest
    fi
  fi

  if [ -n "$SL" ]; then
    selftest_attention_with SCALELAB_CUDA_FLASH=own "scalelab's own flash kernels" "own kernels" selftest-own-attention.log
    selftest_attention_with SCALELAB_CUDA_EAGER=fma "eager attention's FMA-tile kernels" "eager on the FMA tiles" \
      selftest-eager-fma.log
  fi

  run_in_backward_identity

  section "GPU test binaries ($DEV_DIR/tests/*, SCALELAB_TEST_DEVICE=cuda)"
  local t n=0 name rc res passed failed tlog
  for t in "$DEV_DIR"/tests/*; do
    if [ ! -f "$t" ] || [ ! -x "$t" ]; then continue; fi
    n=$((n + 1))
    name=$(basename "$t")
    tlog="$OUT/test-$name.log"
    if [ "$(left)" -lt 30 ]; then
      add "test $name: skipped (time)"
      continue
    fi
    local filter=()
    [ -n "${TEST_FILTER:-}" ] && filter=("--gtest_filter=$TEST_FILTER")
    say "-- $name"
    SCALELAB_TEST_DEVICE=cuda timeout "${TEST_TIMEOUT_S:-240}" "$t" --gtest_brief=1 "${filter[@]}" >"$tlog" 2>&1
    rc=$?
    tail -40 "$tlog"
    passed=$(grep -oE '\[  PASSED  \] [0-9]+' "$tlog" | grep -oE '[0-9]+$' | tail -1)
    failed=$(grep -oE '\[  FAILED  \] [0-9]+ tests?,' "$tlog" | grep -oE '[0-9]+' | tail -1)
    res="$name: exit $rc, ${passed:-0} passed, ${failed:-0} failed"
    [ "$rc" -eq 124 ] && res="$res (timed out)"
    [ "$rc" -ne 0 ] && STATUS=1
    add "test $res"
  done
  [ "$n" -eq 0 ] && add "tests: none in $DEV_DIR/tests/"

  # The model tests that train (goldens, every fine-tuning method against the CPU) once more with
  # eager attention on the FMA-tile kernels (the default is cuBLASLt), so neither path rots.
  t="$DEV_DIR/tests/scalelab_model_tests"
  if [ -x "$t" ] && [ "$(left)" -gt 40 ]; then
    section "model tests with SCALELAB_CUDA_EAGER=fma"
    tlog="$OUT/test-model-eager-fma.log"
    SCALELAB_CUDA_EAGER=fma SCALELAB_TEST_DEVICE=cuda timeout "${TEST_TIMEOUT_S:-240}" "$t" --gtest_brief=1 \
      --gtest_filter="${EAGER_TEST_FILTER:-*Golden*:FinetuneOnDevice.*:*Device*}" >"$tlog" 2>&1
    rc=$?
    tail -20 "$tlog"
    passed=$(grep -oE '\[  PASSED  \] [0-9]+' "$tlog" | grep -oE '[0-9]+$' | tail -1)
    failed=$(grep -oE '\[  FAILED  \] [0-9]+ tests?,' "$tlog" | grep -oE '[0-9]+' | tail -1)
    add "test scalelab_model_tests, eager on the FMA tiles: exit $rc, ${passed:-0} passed, ${failed:-0} failed"
    [ "$rc" -ne 0 ] && STATUS=1
  fi
}

# --optimizer-in-backward on the device: the weights after 3 steps must be the step-end update's,
# byte for byte (tests/train/optimizer_in_backward_test.cpp asserts it on the CPU; these runs
# cover the CUDA AdamW's index_base and the per-layer norm reads). IDENTITY_DEVICE (default cuda)
# runs the same on another device, e.g. cpu to try the script without a GPU.
run_in_backward_identity() {
  section "--optimizer-in-backward: the same weights as the step-end update"
  if [ -z "$SL" ] || [ "$(left)" -lt 60 ]; then
    say "skipped: ${SL:+no time}${SL:-no scalelab}"
    add "in-backward identity: skipped"
    return
  fi
  local dev="${IDENTITY_DEVICE:-cuda}" name extra file a b rc1 rc2
  local common=(train --model llama-tiny --device "$dev" --data synthetic --seq-len 64 --micro-batch-size 4
                --max-steps 3 --max-grad-norm 0 --quiet)
  for name in fp32 bf16 bf16-lora; do
    case "$name" in
      fp32) extra=(); file=model.safetensors ;;
      bf16) extra=(--model-precision bf16); file=model.safetensors ;;
      bf16-lora) extra=(--model-precision bf16 --lora-rank 4); file=adapter_model.safetensors ;;
    esac
    a="$OUT/inbwd-$name-step-end"
    b="$OUT/inbwd-$name-in-backward"
    rm -rf "$a" "$b"
    timeout 60 "$SL" "${common[@]}" "${extra[@]}" --save "$a" >"$a.log" 2>&1
    rc1=$?
    timeout 60 "$SL" "${common[@]}" "${extra[@]}" --optimizer-in-backward --save "$b" >"$b.log" 2>&1
    rc2=$?
    if [ "$rc1" -ne 0 ] || [ "$rc2" -ne 0 ]; then
      say "$name: FAILED to run (exit $rc1 / $rc2): $(tail -2 "$a.log" "$b.log" | tr '\n' ' ' | cut -c1-300)"
      add "in-backward identity $name: FAILED to run (exit $rc1 / $rc2; $a.log, $b.log)"
      STATUS=1
    elif cmp -s "$a/$file" "$b/$file"; then
      say "$name: $file identical"
      add "in-backward identity $name: identical weights"
    else
      say "$name: $file DIFFERS"
      add "in-backward identity $name: weights DIFFER ($a, $b)"
      STATUS=1
    fi
  done
}

# After a failed selftest: each op family in its own process (a device fault poisons the CUDA
# context for every later check of the same process), then compute-sanitizer's memcheck over the
# whole selftest, so the first faulting kernel is named.
isolate_selftest() {
  local fam flog="$OUT/selftest-families.log" rc
  : >"$flog"
  for fam in matmul norm elementwise embedding rope dropout attention loss adamw qat nf4; do
    [ "$(left)" -lt 60 ] && break
    timeout 60 "$SL" selftest --device cuda --filter "^$fam/" >>"$flog" 2>&1
    rc=$?
    say "selftest family $fam: exit $rc"
    add "selftest family $fam: exit $rc ($(grep -c 'FAIL' "$flog") FAIL lines so far)"
  done
  if command -v compute-sanitizer >/dev/null 2>&1 && [ "$(left)" -gt 150 ]; then
    say "compute-sanitizer memcheck (at most ${SANITIZER_TIMEOUT_S:-100}s)"
    timeout "${SANITIZER_TIMEOUT_S:-100}" compute-sanitizer --tool memcheck --print-limit 30 \
      "$SL" selftest --device cuda --dtype fp32,bf16 >"$OUT/sanitizer.log" 2>&1
    add "compute-sanitizer: exit $?; $(grep -m1 -E 'Invalid|ERROR SUMMARY' "$OUT/sanitizer.log" | cut -c1-150)"
  fi
}

# The attention op alone on PyTorch's SDPA backends, then scalelab's step profile with cuDNN's
# SDPA and with its own flash kernels (llama-3.2-1b, bf16, flash, fused, micro-batch 8).
run_profile() {
  if [ "${PROFILE_ATTENTION:-1}" != 0 ]; then
    section "attention alone: PyTorch SDPA (bench/gpu/attention_op.py)"
    timeout 90 "$PY" bench/gpu/attention_op.py 2>&1 | tee "$OUT/attention_op.txt"
    add "attention op: $(grep -E '^(flash|cudnn) ' "$OUT/attention_op.txt" | awk '{printf "%s fwd %s ms bwd %s ms; ", $1, $2, $4}')"
  fi
  [ -z "$SL" ] && return
  # The same short run four ways: unprofiled; --profile --trace (op scopes timed with CUDA events,
  # CUPTI activity); events without CUPTI; the old synchronized scopes. Step times side by side say
  # what profiling costs; the CUPTI tables say where the device idles (launch-bound fraction).
  local args=(train --device cuda --model llama-3.2-1b --seq-len 1024 --micro-batch-size "${PROFILE_MB:-8}"
    --model-precision bf16 --attn flash --fused-kernels --max-steps 6 --bench-warmup-steps 2)
  local name env extra
  for name in plain events-cupti events sync; do
    [ "$(left)" -lt 60 ] && { add "profile $name: skipped (time)"; continue; }
    section "scalelab train, profiling: $name"
    env=(); extra=()
    case "$name" in
      events-cupti) extra=(--profile --trace "$OUT/profile.trace.json") ;;
      events) env=(SCALELAB_CUPTI=0); extra=(--profile) ;;
      sync) env=(SCALELAB_CUPTI=0 SCALELAB_PROFILE_SYNC=1); extra=(--profile) ;;
    esac
    env "${env[@]}" timeout 120 "$SL" "${args[@]}" "${extra[@]}" --json "$OUT/profile-$name.json" \
      >"$OUT/profile-$name.log" 2>&1
    local rc=$?
    grep -E "Step time|GPU activity|^  [a-z]" "$OUT/profile-$name.log" | head -18
    add "profile $name: exit $rc, $(grep -m1 'Step time' "$OUT/profile-$name.log")"
  done
  if [ -f "$OUT/profile.trace.json" ]; then
    section "scalelab profile-summary of the CUPTI trace"
    "$SL" profile-summary --top 25 "$OUT/profile.trace.json" > "$OUT/profile-summary.md" 2>&1
    head -c 6000 "$OUT/profile-summary.md"
    grep -E "device_idle_fraction|launch_api_s|sync_api_s" "$OUT/profile-summary.md" | head -5
    add "profile-summary: $(grep -E 'device_idle_fraction' "$OUT/profile-summary.md" | head -1)"
    gzip -f "$OUT/profile.trace.json"
  fi
}

run_bench() {
  section "compare.py (scalelab vs HF Trainer)"
  local budget=$(( $(left) - 20 ))
  if [ "$budget" -lt 60 ]; then
    say "skipped: ${budget}s left"
    add "compare: skipped (${budget}s left)"
    return
  fi
  local args=("$@") has_budget=0 a
  for a in "${args[@]}"; do case "$a" in --budget-s|--budget-s=*) has_budget=1 ;; esac; done
  [ "$has_budget" -eq 0 ] && args+=(--budget-s "$budget")
  say "$PY bench/gpu/compare.py ${args[*]}"
  timeout $(( budget + 15 )) "$PY" bench/gpu/compare.py "${args[@]}"
  local rc=$?
  if [ -f "$OUT/compare.md" ]; then
    add "compare: exit $rc, table in compare.md (above), raw results in compare.json"
  else
    add "compare: exit $rc, no table written"
    STATUS=1
  fi
}

# The fine-tuning methods on the GPU through the lab (one sweep, fixed micro-batch), then the HF
# Trainer (full) and peft (LoRA) at the same model, precision, attention and micro-batch.
run_methods() {
  section "fine-tuning methods (examples/finetune-methods-gpu.toml)"
  if [ -z "$SL" ]; then
    add "methods: skipped (no scalelab)"
  else
    local db="$OUT/methods.db"
    local reserve=100  # for the HF peers after the sweep
    [ "${METHODS_HF:-1}" = 0 ] && reserve=5
    timeout $(( $(left) - reserve )) "$SL" sweep examples/finetune-methods-gpu.toml --db "$db" --log-dir "$OUT/methods-logs" \
      >"$OUT/methods.log" 2>&1
    local rc=$?
    tail -12 "$OUT/methods.log"
    "$SL" results --db "$db" --sweep finetune-methods-gpu --view memory >"$OUT/methods.md" 2>&1
    cat "$OUT/methods.md"
    add "methods sweep: exit $rc ($(grep -cE '\| ok ' "$OUT/methods.md") ok rows), tables in methods.md"
    [ "$rc" -ne 0 ] && STATUS=1
  fi
  local mb=8 side name
  [ "${METHODS_HF:-1}" = 0 ] && { add "hf peers: skipped (METHODS_HF=0)"; return; }
  for side in full lora; do
    [ "$(left)" -lt 60 ] && { add "hf $side: skipped (time)"; continue; }
    name="hf-$side"
    local extra=()
    [ "$side" = lora ] && extra=(--lora-rank 16)
    section "HF peer: $side (micro-batch $mb, bf16 weights, sdpa)"
    timeout 150 "$PY" bench/gpu/hf_benchmark.py --model llama-3.2-1b --seq-len 1024 --micro-batch-size "$mb" \
      --torch-dtype bfloat16 --attn sdpa --max-steps 8 --warmup-steps 3 "${extra[@]}" --json "$OUT/$name.json" \
      >"$OUT/$name.log" 2>&1
    local hrc=$?
    grep -E "Training throughput|Max reserved" "$OUT/$name.log"
    add "hf $side: exit $hrc, $(grep -m1 'Training throughput' "$OUT/$name.log") $(grep -m1 'Max reserved' "$OUT/$name.log")"
  done
}

# The same short run with the first kernels (SCALELAB_CUDA_KERNELS=v1) and the current ones,
# alternating (v1, new, v1, new): step time and --profile's op families of each.
run_kernels_ab() {
  [ -z "$SL" ] && { add "kernels-ab: skipped (no scalelab)"; return; }
  local args=(train --device cuda --model llama-3.2-1b --seq-len 1024 --micro-batch-size "${AB_MB:-8}"
    --model-precision bf16 --attn flash --fused-kernels --max-steps 6 --bench-warmup-steps 2 --profile)
  local round variant
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    for variant in v1 new; do
      [ "$(left)" -lt 40 ] && { add "kernels-ab $variant round $round: skipped (time)"; continue; }
      section "kernels-ab: $variant, round $round"
      local log="$OUT/ab-$variant-$round.log"
      if [ "$variant" = v1 ]; then
        SCALELAB_CUDA_KERNELS=v1 timeout 90 "$SL" "${args[@]}" --json "$OUT/ab-$variant-$round.json" >"$log" 2>&1
      else
        timeout 90 "$SL" "${args[@]}" --json "$OUT/ab-$variant-$round.json" >"$log" 2>&1
      fi
      local rc=$?
      grep -E "Step time|\\| (adamw|norm|activation|rope|loss|matmul|attention|elementwise|embedding) \\|$" "$log" | head -12
      add "kernels-ab $variant round $round: exit $rc, $(grep -m1 'Step time' "$log")"
      [ "$rc" -ne 0 ] && STATUS=1
    done
  done
}

# Eager attention on cuBLASLt (the default since the H200 run of 2026-11-27) against the first
# FMA-tile kernels: the same short run under each switch, with the plan's prediction for each (the
# plan follows the switch: cuBLASLt's fp32 score workspace is larger). EAGER_HF=1: the HF Trainer at the
# OPT setting in the same call (bench/gpu/hf_benchmark.py), the peer of the 0.82x row.
run_eager_ab() {
  [ -z "$SL" ] && { add "eager-ab: skipped (no scalelab)"; return; }
  local model mb variant log rc plan
  for model in opt-1.3b llama-3.2-1b; do
    if [ "$model" = opt-1.3b ]; then mb="${EAGER_OPT_MB:-16}"; else mb="${EAGER_LLAMA_MB:-8}"; fi
    local args=(--device cuda --model "$model" --seq-len 1024 --micro-batch-size "$mb" --model-precision bf16 --attn eager)
    for variant in fma cublaslt; do
      [ "$(left)" -lt 45 ] && { add "eager-ab $model $variant: skipped (time)"; continue; }
      section "eager-ab: $model micro-batch $mb, $variant"
      log="$OUT/eager-$model-$variant.log"
      local env=(SCALELAB_CUDA_EAGER="$variant")
      env "${env[@]}" "$SL" plan "${args[@]}" >"$log.plan" 2>&1
      plan=$(grep -m1 -E '^ *total ' "$log.plan" | awk '{print $2, $3}')
      env "${env[@]}" timeout 100 "$SL" train "${args[@]}" --max-steps 6 --bench-warmup-steps 2 \
        --json "$OUT/eager-$model-$variant.json" >"$log" 2>&1
      rc=$?
      grep -E "^step [0-9]|Step time|Max reserved|Training throughput" "$log" | tail -5
      say "plan: $plan"
      add "eager-ab $model mb $mb $variant: exit $rc, $(grep -m1 'Step time' "$log"), $(grep -m1 'Training throughput' "$log" | sed 's/Training throughput: //'), $(grep -m1 'Max reserved' "$log"); plan $plan"
      [ "$rc" -ne 0 ] && STATUS=1
    done
  done
  if [ "${EAGER_HF:-0}" = 1 ] && [ "$(left)" -gt 90 ]; then
    section "eager-ab: HF Trainer, opt-1.3b bf16 eager micro-batch ${EAGER_OPT_MB:-16}"
    timeout $(( $(left) - 20 )) "$PY" bench/gpu/hf_benchmark.py --model opt-1.3b --micro-batch-size "${EAGER_OPT_MB:-16}" \
      --torch-dtype bfloat16 --attn eager >"$OUT/eager-hf-opt.log" 2>&1
    rc=$?
    grep -E "Training throughput|Max reserved" "$OUT/eager-hf-opt.log"
    add "eager-ab HF opt-1.3b: exit $rc, $(grep -m1 'Training throughput' "$OUT/eager-hf-opt.log")"
  fi
}

# --optimizer-in-backward on the device: step time and peak against the step-end update, alternating.
run_in_backward_timing() {
  [ -z "$SL" ] && { add "in-backward timing: skipped (no scalelab)"; return; }
  local args=(train --device cuda --model llama-3.2-1b --seq-len 1024 --micro-batch-size 8 --model-precision bf16
              --attn flash --max-grad-norm 0 --max-steps 6 --bench-warmup-steps 2)
  local variant log
  for variant in step-end in-backward; do
    [ "$(left)" -lt 60 ] && { add "in-backward timing $variant: skipped (time)"; continue; }
    section "--optimizer-in-backward timing: $variant"
    log="$OUT/inbwd-timing-$variant.log"
    if [ "$variant" = in-backward ]; then
      timeout 90 "$SL" "${args[@]}" --optimizer-in-backward >"$log" 2>&1
    else
      timeout 90 "$SL" "${args[@]}" >"$log" 2>&1
    fi
    local rc=$?
    grep -E "Step time|Max reserved" "$log"
    add "in-backward timing $variant: exit $rc, $(grep -m1 'Step time' "$log"), $(grep -m1 'Max reserved' "$log")"
    [ "$rc" -ne 0 ] && STATUS=1
  done
}

# The HF Trainer memory rows whose prediction is not yet the GPU's to the byte, each with its
# allocator trace (docs/predict.md, bench/README.md): fp32 sdpa (PyTorch's math path, modelled as
# eager: -0.09 %), Liger under autocast with eager (-0.04 %; allocated 1 KiB under), Liger under
# autocast with sdpa (allocated 37 KiB under), Qwen2 + Liger (allocated 1 KiB under), and Liger at
# micro-batch 16 without checkpointing (never run through hf_memory.py; the H100 compare row is the
# worst, +0.89 %).
run_hf_memory_rows() {
  local budget=$(( $(left) - 15 ))
  [ "$budget" -lt 60 ] && { add "hf_memory: skipped (${budget}s left)"; return; }
  section "hf_memory.py: the rows not yet exact, with traces (budget ${budget}s)"
  local rows=llama-fp32-eager-mb8-64GiB,llama-fp32-sdpa-mb6,llama-bf16mixed-eager-mb4-liger,llama-bf16mixed-sdpa-mb4-liger,qwen2-bf16-sdpa-mb8-liger,llama-bf16-sdpa-mb16-liger
  timeout $(( budget + 10 )) "$PY" bench/gpu/hf_memory.py --out "$OUT/hfm" --budget-s $(( budget - 40 )) \
    --trace "$rows" --only "$rows" >"$OUT/hf_memory.txt" 2>&1
  local rc=$?
  tail -14 "$OUT/hf_memory.txt"
  add "hf_memory: exit $rc, $(grep -c '| ok |' "$OUT/hf_memory.txt") rows measured (hf_memory.txt, hfm/)"
}

# Older transformers (plan --transformers-version 4.43 to 4.48; `versions` below carries them smaller): the published
# point's job, Llama-3.2-1B fp32 eager micro-batch 6, with its allocator trace, under each release
# carried as wheels in $WHEELS_DIR/tf4*/ (e.g. tf445/: transformers 4.45.2, tokenizers 0.20.3,
# huggingface_hub 0.26.2, accelerate 1.0.1; tf444/: transformers 4.44.2, tokenizers 0.19.1,
# huggingface_hub 0.24.7, accelerate 0.34.2 — `pip download --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux2014_x86_64 -d .whl/tf445 ...`), put first on PYTHONPATH.
# The published job under each carried older transformers (4.45 first): as the reference ran it, under
# torchrun with one process (DDP over a world of one; the trace of micro-batch 6), micro-batch 7 in
# 64 GiB, and started by python. Predicted (torch 2.11 and 2.4 alike): 4.45-4.48 torchrun 61.88 GiB
# reserved and 7 out of memory, python 60.19; 4.43-4.44 torchrun 61.53 and 7 out of memory, python 59.81.
run_hf_memory_older() {
  local root="${WHEELS_DIR:-$DEV_DIR/wheels}" dir name budget rc
  local rows=llama-fp32-eager-mb6-torchrun1,llama-fp32-eager-mb7-64GiB-torchrun1,llama-fp32-eager-mb6
  local seen=" "
  for dir in "$root"/tf445/ "$root"/tf4*/; do
    [ -d "$dir" ] || continue
    case "$seen" in *" $(basename "$dir") "*) continue ;; esac  # tf445 runs first, once
    seen="$seen$(basename "$dir") "
    name=$(basename "$dir")
    ls "$dir"/transformers-*.whl >/dev/null 2>&1 || { add "hf_memory $name: no transformers wheel"; continue; }
    budget=$(( $(left) - 15 ))
    [ "$budget" -lt 90 ] && { add "hf_memory $name: skipped (${budget}s left)"; continue; }
    section "hf_memory.py under $(basename "$dir"/transformers-*.whl): $rows (the torchrun mb6 with its trace)"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "/tmp/$name" \
      "$dir"/*.whl >"$OUT/$name-pip.txt" 2>&1 || { add "hf_memory $name: pip failed ($name-pip.txt)"; continue; }
    PYTHONPATH="/tmp/$name" timeout $(( budget < 240 ? budget : 240 )) "$PY" bench/gpu/hf_memory.py \
      --out "$OUT/hfm-$name" --budget-s 200 --trace llama-fp32-eager-mb6-torchrun1 --only "$rows" \
      >"$OUT/hf_memory_$name.txt" 2>&1
    rc=$?
    tail -6 "$OUT/hf_memory_$name.txt"
    add "hf_memory $name: exit $rc (hf_memory_$name.txt, hfm-$name/; predicted mb6 torchrun / python: 4.45-4.48 61.88 / 60.19 GiB reserved, 4.43-4.44 61.53 / 59.81; mb7 64GiB torchrun: OOM)"
  done
}

# The HF Trainer memory rows under older transformers releases, each carried as $HFV_DIR/tfNNN.tar.xz
# (bench/gpu/pack_transformers.py: the release trimmed to the families measured, the huggingface_hub
# and accelerate it was used with, and a version stub for tokenizers, which these rows never run),
# unpacked to /tmp/tfNNN and put first on PYTHONPATH; the machine's peft is hidden (HF_MEMORY_HIDE:
# it imports families the trimmed release leaves out, and these rows never use it). Make one here:
#   pip install --no-deps --target /tmp/tf445 transformers==4.45.2 accelerate==1.0.1 huggingface_hub==0.36.0
#   python3 bench/gpu/pack_transformers.py /tmp/tf445 .hfv/tf445.tar.xz --pack huggingface_hub=/tmp/tf445 \
#       --pack accelerate=/tmp/tf445 --tokenizers-version 0.20.3
#   (4.55: --tokenizers-version 0.21.4; 4.56 and 4.57: 0.22.2 with huggingface_hub 0.36; 5.0: 0.22.2 alone)
# (about 1.7 MiB each; carry ".hfv" with the call; HFV_ORDER picks the releases, VERSIONS_CHECK=0 skips check) Rows per release (most important first; the
# first of each is traced); predictions: `scalelab plan --stack hf-trainer --transformers-version V`.
versions_rows() {
  case "$1" in
    # (2026-11-27 measured the first five of tf445 and the first three of tf4554; the published
    # 64 GiB row, llama-fp32-eager-mb6-64GiB-torchrun1, is the one left there)
    tf445) echo "llama-fp32-eager-mb6-64GiB-torchrun1,llama-fp32-eager-mb6-torchrun1,llama-fp32-eager-mb7-64GiB-torchrun1,opt-fp32-eager-mb4,opt-bf16mixed-eager-mb4,llama-fp32-eager-mb6" ;;
    tf4554) echo "llama-fp32-eager-mb6,opt-fp32-eager-mb4,llama-bf16-sdpa-mb6,llama-bf16mixed-eager-mb6,llama-fp32-eager-mb6-ckpt" ;;
    tf4562|tf4576) echo "llama-bf16mixed-eager-mb6,llama-fp32-eager-mb6,llama-bf16-sdpa-mb6,opt-fp32-eager-mb4,opt-bf16mixed-eager-mb4" ;;
    tf500) echo "llama-fp32-eager-mb6,opt-fp32-eager-mb4" ;;
    tf4442) echo "llama-fp32-eager-mb6-torchrun1,opt-fp32-eager-mb4" ;;
    *) echo "llama-fp32-eager-mb6" ;;
  esac
}

run_versions() {
  local dir="${HFV_DIR:-.hfv}" order="${HFV_ORDER:-tf445 tf4562 tf4554 tf500 tf4442}" name tarball rows budget rc
  for name in $order; do
    tarball="$dir/$name.tar.xz"
    [ -f "$tarball" ] || { add "versions $name: no $tarball"; continue; }
    rows=$(versions_rows "$name")
    budget=$(( $(left) - ${HFV_RESERVE_S:-60} ))
    [ "$budget" -lt 45 ] && { add "versions $name: skipped (${budget}s left)"; continue; }
    section "hf_memory.py under $name: $rows (budget ${budget}s)"
    rm -rf "/tmp/$name" && mkdir -p "/tmp/$name" && tar xJf "$tarball" -C "/tmp/$name" \
      || { add "versions $name: unpack failed"; continue; }
    HF_MEMORY_HIDE=peft PYTHONPATH="/tmp/$name${PYTHONPATH:+:$PYTHONPATH}" timeout $(( budget + 10 )) "$PY" bench/gpu/hf_memory.py --out "$OUT/hfm-$name" \
      --budget-s "$budget" --trace "$rows" --only "$rows" >"$OUT/hf_memory_$name.txt" 2>&1
    rc=$?
    grep -E "HF_MEMORY_HEADER" "$OUT/hf_memory_$name.txt" | cut -c1-200
    grep -E "^\| " "$OUT/hf_memory_$name.txt"
    add "versions $name: exit $rc, $(grep -c '| ok |' "$OUT/hf_memory_$name.txt") ok, $(grep -c '| oom |' "$OUT/hf_memory_$name.txt") oom (hf_memory_$name.txt, hfm-$name/)"
  done
}

main() {
  say "run.sh $mode $* (budget ${BUDGET}s, OUT=$OUT, $(date -u +%Y-%m-%dT%H:%M:%SZ), git $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
  device_info
  find_scalelab
  case "$mode" in
    check) run_checks ;;
    profile) run_profile ;;
    bench) run_bench "$@" ;;
    methods) run_methods ;;
    kernels-ab) run_kernels_ab ;;
    eager-ab) run_eager_ab ;;
    next)
      # the published point under the older transformers first (issue 22's open measurement)
      run_checks
      run_hf_memory_older
      run_in_backward_timing
      run_hf_memory_rows
      ;;
    versions) run_versions; [ "${VERSIONS_CHECK:-1}" = 1 ] && run_checks ;;
    all) run_checks; run_profile; run_bench "$@" ;;
  esac
  section "summary"
  if [ -f "$OUT/compare.md" ] && [ "$mode" != check ]; then
    cat "$OUT/compare.md"
    echo
  fi
  local s
  for s in "${SUMMARY[@]}"; do say "  $s"; done
  say "  logs: $OUT/ ($(cd "$OUT" && find . -maxdepth 1 -type f -printf '%f '))"
  say "  total ${SECONDS}s; $([ "$STATUS" -eq 0 ] && echo OK || echo 'SOMETHING FAILED (see above)')"
  return "$STATUS"
}

main "$@" 2>&1 | tee -a "$LOG"
rc="${PIPESTATUS[0]}"
# Everything in one file as well: the lent machine's tool returns only a few files of $OUT (the
# first call of 2026-11-27 lost its hf_memory.jsonl and traces that way and ran them again).
tar czf "$OUT.tgz" -C "$OUT" . 2>/dev/null && mv "$OUT.tgz" "$OUT/00-all.tgz"
exit "$rc"
