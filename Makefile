# scalelab: the two commands of the README, and the pieces they are made of.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CTEST_ARGS ?=

.PHONY: all deps configure build test demo bench golden tokenizer-golden clean sanitize fuzz fuzz-build

all: build

deps:
	@scripts/deps.sh
	@if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; then scripts/cudnn-frontend.sh; fi

configure: deps
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

demo: build
	@scripts/demo.sh $(BUILD_DIR)

bench: build
	@echo "benchmarks: see bench/README.md (each prints its figures)"

golden:
	@tests/golden/make_golden.sh

# Tokenizer and GGUF reference data (HF tokenizers, the gguf package; docs/data.md).
tokenizer-golden:
	@tests/golden/tokenizer/make_tokenizer_golden.sh --real

clean:
	rm -rf $(BUILD_DIR)

# Hardening (docs/reliability.md). Neither runs in CI: on CI's 2 cores each build takes most of
# an hour. Both use clang and their own build directory, with CUDA off.
SANITIZE_DIR ?= build-asan
FUZZ_DIR ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= safetensors checkpoint checkpoint_index config sweep_spec token_file
HARDEN_CMAKE = -G Ninja -DCMAKE_BUILD_TYPE=Release -DSCALELAB_WITH_CUDA=OFF -DSCALELAB_WITH_NCCL=OFF -DSCALELAB_WERROR=OFF

# ASan + UBSan over the whole suite; OpenMPI's own leaks are suppressed (tests/sanitize/lsan.supp).
sanitize:
	@scripts/deps.sh clang libclang-rt-dev libomp-dev
	@CC=clang CXX=clang++ cmake -S . -B $(SANITIZE_DIR) $(HARDEN_CMAKE) -DSCALELAB_SANITIZE=ON -DSCALELAB_BENCH=OFF >/dev/null
	@cmake --build $(SANITIZE_DIR) -j $(JOBS)
	@cd $(SANITIZE_DIR) && $(CURDIR)/tests/sanitize/run.sh -j $(JOBS) $(CTEST_ARGS)

# libFuzzer harnesses (tests/fuzz/), each run FUZZ_SECONDS on its committed corpus and dictionary;
# what they find lands in $(FUZZ_DIR)/fuzz/<target>/ (new corpus) and crash-* files there.
fuzz-build:
	@scripts/deps.sh clang libclang-rt-dev libomp-dev
	@CC=clang CXX=clang++ cmake -S . -B $(FUZZ_DIR) $(HARDEN_CMAKE) -DSCALELAB_FUZZ=ON -DSCALELAB_TESTS=OFF -DSCALELAB_BENCH=OFF >/dev/null
	@cmake --build $(FUZZ_DIR) -j $(JOBS) --target fuzz_all

fuzz: fuzz-build
	@for t in $(FUZZ_TARGETS); do scripts/fuzz.sh $(FUZZ_DIR) $$t -max_total_time=$(FUZZ_SECONDS) || exit 1; done
