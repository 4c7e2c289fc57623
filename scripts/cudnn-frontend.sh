#!/usr/bin/env bash
# Fetches the header-only cuDNN frontend (NVIDIA's C++ graph API over cuDNN, MIT-licensed) into
# third_party/cudnn-frontend/include, from PyPI's nvidia-cudnn-frontend wheel, pinned by version and
# sha256. The CUDA backend's flash attention uses it to call cuDNN's fused SDPA
# (src/kernels/cuda/attention_cudnn.cpp); without it the build uses scalelab's own flash kernels.
# Usage: scripts/cudnn-frontend.sh          (does nothing when the pinned version is there)
# Exit 0 also when the download fails (no network): the build then goes on without it, and says so.
set -uo pipefail

VERSION=1.32.0
# The cp311 manylinux wheel (its include/ is the same in every wheel of a version).
WHEEL=nvidia_cudnn_frontend-1.32.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
SHA256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/third_party/cudnn-frontend"
if [ -f "$dest/VERSION" ] && [ "$(cat "$dest/VERSION")" = "$VERSION" ] && [ -f "$dest/include/cudnn_frontend.h" ]; then
  echo "cudnn-frontend: $VERSION present"
  exit 0
fi
py=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -m pip --version >/dev/null 2>&1; then py="$p"; break; fi
done
if [ -z "$py" ]; then
  echo "cudnn-frontend: no python3 with pip here; building without cuDNN's SDPA (scalelab's flash kernels instead)" >&2
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if ! "$py" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.11 \
     --platform manylinux_2_28_x86_64 -d "$tmp" "nvidia-cudnn-frontend==$VERSION" >"$tmp/pip.log" 2>&1 \
   || [ ! -f "$tmp/$WHEEL" ]; then
  echo "cudnn-frontend: could not download nvidia-cudnn-frontend==$VERSION from PyPI ($(tail -1 "$tmp/pip.log"));" \
       "building without cuDNN's SDPA (scalelab's flash kernels instead)" >&2
  exit 0
fi
got="$(sha256sum "$tmp/$WHEEL" | cut -d' ' -f1)"
if [ "$got" != "$SHA256" ]; then
  echo "cudnn-frontend: $WHEEL has sha256 $got, expected $SHA256: not using it" >&2
  exit 0
fi
rm -rf "$dest"
mkdir -p "$dest"
"$py" - "$tmp/$WHEEL" "$dest" <<'PY'
import sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.startswith("include/")]
    z.extractall(dest, names)
    lic = [n for n in z.namelist() if n.endswith("LICENSE") or n.endswith("LICENSE.txt")]
    if lic:
        with open(dest + "/LICENSE", "wb") as f:
            f.write(z.read(lic[0]))
PY
echo "$VERSION" >"$dest/VERSION"
echo "cudnn-frontend: $VERSION in $dest/include"
