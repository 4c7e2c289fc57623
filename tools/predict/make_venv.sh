#!/usr/bin/env bash
# Creates the reference-tooling virtualenv for the hf-trainer memory predictor's tracer
# (tools/predict/trace_hf.py). Pinned to the versions the predictor models and that the lent
# GPU machine runs, so that traced goldens and GPU measurements describe the same code.
# Usage: tools/predict/make_venv.sh [VENV_DIR]   (default /work/venvs/predict)
set -euo pipefail
VENV="${1:-/work/venvs/predict}"
TORCH_VERSION=2.11.0
TRANSFORMERS_VERSION=5.17.0
ACCELERATE_VERSION=1.13.0
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
# The PyPI wheel of torch for Linux x86-64 is the CUDA build (with its nvidia-* wheels, ~4 GB in
# all); the tracer runs it on the CPU only.
"$VENV/bin/pip" install --quiet "torch==${TORCH_VERSION}" "transformers==${TRANSFORMERS_VERSION}" \
    "accelerate==${ACCELERATE_VERSION}"
"$VENV/bin/python" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
