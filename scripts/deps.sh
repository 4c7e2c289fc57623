#!/usr/bin/env bash
# Installs what scalelab needs to build and test, from Debian packages, only where missing.
# Usage: scripts/deps.sh [extra-package ...]
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config ccache
  libopenblas-openmp-dev         # BLAS (GEMM); the OpenMP build shares threads with our kernels
  nlohmann-json3-dev libcli11-dev libtomlplusplus-dev libsqlite3-dev
  libgtest-dev libgmock-dev
  libopenmpi-dev openmpi-bin     # data-parallel ranks on the host (MPI)
  slurm-wlm munge                # a real SLURM cluster on localhost for the launcher tests (scripts/slurm-localhost.sh)
  libxgboost-dev                 # gradient-boosted feature importance (analysis)
  libpcre2-dev                   # tokenizer pre-tokenizer regexes (Unicode classes, lookahead, JIT)
  libeigen3-dev                  # OLS and the t/F/chi-square tails of the analysis (header-only, MPL-2.0)
  zlib1g-dev                     # CRC-32 of what a resumed DPO / QLoRA run rebuilds from --model (core/checksum.h)
  libjs-vega                     # Vega, compiled into `scalelab report` (cmake/vega_bundle.cmake)
  chromium                       # the report's browser test (headless; tests/report/)
  fonts-dejavu-core              # a font for the report's screenshots in headless Chromium
  python3                        # test helper scripts (fake workloads, fake nvidia-smi)
  clang libclang-rt-dev libomp-dev  # the fuzz harnesses (libFuzzer; make test runs them briefly) and make sanitize
  "$@"
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#PKGS[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "deps: missing packages (${missing[*]}) and not root; install them or re-run as root" >&2
    exit 2
  fi
fi
echo "deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
