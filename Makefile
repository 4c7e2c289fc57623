# scalelab: the two commands of the README, and the pieces they are made of.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CTEST_ARGS ?=

.PHONY: all deps configure build test demo bench golden clean

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

clean:
	rm -rf $(BUILD_DIR)
