#!/usr/bin/env bash
# Installs another torch release beside the tracer's venv (tools/predict/make_venv.sh), for tracing
# the Trainer under it (tools/predict/trace_hf.py writes NAME[.tfR].torchX.Y.cpu.events): torch and
# the nvidia-* CUDA wheels its metadata pins, all into one directory that goes first on PYTHONPATH.
# (The PyPI wheels are the CUDA builds: their import loads those libraries even on a CPU.)
# Usage: tools/predict/make_torch_overlay.sh VERSION [DIR]   (DIR default /work/venvs/torch<major><minor>)
#   then: PYTHONPATH=DIR[:/work/venvs/tf445] /work/venvs/predict/bin/python tools/predict/trace_hf.py ...
# The venv's Python must match the wheels' (cp311 here). torch 2.4 to 2.6 are manylinux1 wheels,
# 2.7 and later manylinux_2_28.
set -euo pipefail
VERSION="${1:?usage: make_torch_overlay.sh VERSION [DIR]}"
MM=$(echo "$VERSION" | cut -d. -f1,2 | tr -d .)
DIR="${2:-/work/venvs/torch$MM}"
PY="${PYTHON:-/work/venvs/predict/bin/python}"
TAG=$("$PY" -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')
WHEELS=$(mktemp -d)
trap 'rm -rf "$WHEELS"' EXIT
for plat in manylinux_2_28_x86_64 manylinux1_x86_64; do
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$TAG" --platform "$plat" \
      -d "$WHEELS" "torch==$VERSION" 2>/dev/null && break
done
WHL=$(ls "$WHEELS"/torch-*.whl) || { echo "make_torch_overlay: no torch $VERSION wheel for Python $TAG" >&2; exit 1; }
# the nvidia-* pins of its Linux x86-64 build, from the wheel's METADATA
mapfile -t NV < <(unzip -p "$WHL" '*.dist-info/METADATA' | sed -n 's/^Requires-Dist: \(nvidia-[^ ;]*\)[ (]*\(==[^ );]*\)*.*/\1\2/p' | tr -d '()')
# one pip call: several --target calls would each replace the shared nvidia/ package directory
"$PY" -m pip install --quiet --no-deps --only-binary=:all: --target "$DIR" "$WHL" "${NV[@]}"
PYTHONPATH="$DIR" "$PY" -c "import torch; print('torch', torch.__version__, 'in $DIR')"
