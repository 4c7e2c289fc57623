#!/usr/bin/env bash
# Packs what a GPU machine needs to run scalelab and its device tests from this build:
#   scripts/package-device.sh [OUT_DIR] [--build DIR] [--tar] [--with-cuda-libs] [--bundle-libstdcxx]
# OUT_DIR (default .device/) receives
#   bin/scalelab; tests/scalelab_device_ops_tests, tests/scalelab_model_tests (the golden + switch
#         tests; bench/gpu/run.sh check runs every binary in tests/ with SCALELAB_TEST_DEVICE=cuda),
#   lib/  every shared library they load that is not glibc, libstdc++/libgcc_s or the CUDA driver
#         (OpenBLAS, libgomp, SQLite, Open MPI and its friends, toml++, ...),
#   env.sh  sets LD_LIBRARY_PATH (lib/, then the GPU machine's /usr/local/cuda) and
#           SCALELAB_SOURCE_DIR (the checkout holding tests/golden/data); run a command through it:
#             .device/env.sh scalelab selftest --device cuda
#             .device/env.sh .device/tests/scalelab_device_ops_tests
#             SCALELAB_TEST_DEVICE=cuda .device/env.sh .device/tests/scalelab_model_tests --gtest_filter='*Golden*'
#             .device/env.sh --check      (ldd of every binary: lists anything not found)
# The CUDA libraries (cudart, cuBLAS, cuBLASLt, NCCL) are left out by default: cuBLASLt alone is
# ~520 MiB; the GPU machine has its own CUDA 13 in /usr/local/cuda, which env.sh puts on the path.
# --with-cuda-libs copies them anyway (for a machine without a toolkit; far above 60 MiB).
# --tar also writes OUT_DIR.tar.xz (about a fifth of the folder: OpenBLAS alone is 35 MiB, over
# what a call carries with the tree); carry that file and unpack it there first: tar xJf .device.tar.xz
# --bundle-libstdcxx copies libstdc++/libgcc_s too (for a GPU machine whose libstdc++ is older than
# the GLIBCXX version this script reports).
set -euo pipefail

out=.device
build=build
with_cuda=0
bundle_cxx=0
make_tar=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --with-cuda-libs) with_cuda=1; shift ;;
    --tar) make_tar=1; shift ;;
    --bundle-libstdcxx) bundle_cxx=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    -*) echo "package-device.sh: unknown option $1" >&2; exit 2 ;;
    *) out="$1"; shift ;;
  esac
done

bins=("$build/scalelab" "$build/tests/scalelab_device_ops_tests" "$build/tests/scalelab_model_tests")
for b in "${bins[@]}"; do
  if [ ! -x "$b" ]; then
    echo "package-device.sh: $b is missing — build first: cmake --build $build --target scalelab scalelab_device_ops_tests scalelab_model_tests" >&2
    exit 1
  fi
done

rm -rf "$out"
mkdir -p "$out/bin" "$out/tests" "$out/lib"
cp -L "${bins[0]}" "$out/bin/"
for b in "${bins[@]:1}"; do cp -L "$b" "$out/tests/"; done

# Which libraries stay on the GPU machine: glibc's, the C++ runtime's (unless bundled), the driver's.
is_system() {
  case "$1" in
    linux-vdso.so*|ld-linux*.so*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|libutil.so*|libanl.so*|libnsl.so*|libBrokenLocale.so*|libmvec.so*) return 0 ;;
    libcuda.so*|libnvidia-*.so*) return 0 ;;
    libstdc++.so*|libgcc_s.so*) [ "$bundle_cxx" = 0 ] && return 0 ;;
  esac
  return 1
}
is_cuda_toolkit() {
  case "$1" in
    libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*|libcudnn*.so*|libnvrtc*.so*|libnvJitLink.so*) return 0 ;;
  esac
  return 1
}

declare -A copied=()
left_to_gpu=()
not_found=()
for b in "${bins[@]}"; do
  while read -r name arrow path _; do
    [ -z "$name" ] && continue
    if [ "$arrow" != "=>" ]; then continue; fi  # the loader, vdso
    if [ "$path" = "not" ]; then not_found+=("$name (needed by $(basename "$b"))"); continue; fi
    is_system "$name" && continue
    if is_cuda_toolkit "$name" && [ "$with_cuda" = 0 ]; then
      left_to_gpu+=("$name")
      continue
    fi
    [ -n "${copied[$name]:-}" ] && continue
    cp -L "$path" "$out/lib/$name"
    copied[$name]="$path"
  done < <(ldd "$b")
done
# Loaded with dlopen, so ldd does not list it: libcupti (the CUDA backend's GPU activity profiler,
# --profile / --trace on CUDA; 4 MiB). The GPU machine's toolkit keeps it under extras/ or not at
# all, so the package brings the one this build's headers match.
cupti=$(ldconfig -p 2>/dev/null | awk '/libcupti\.so\.13 / {print $NF; exit}')
[ -z "$cupti" ] && cupti=$(find /usr/local/cuda/ /usr/local/cuda/extras/CUPTI -name 'libcupti.so.13' 2>/dev/null | head -1)
if [ -n "$cupti" ]; then cp -L "$cupti" "$out/lib/"; else echo "package-device.sh: libcupti.so.13 not found: GPU activity tables will be missing" >&2; fi

if [ ${#not_found[@]} -gt 0 ]; then
  printf 'package-device.sh: not found on this machine: %s\n' "${not_found[@]}" >&2
  exit 1
fi

cat > "$out/env.sh" <<'ENV'
#!/usr/bin/env bash
# Runs a packaged command with the packaged libraries, then the GPU machine's CUDA, on the path.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cuda="${CUDA_HOME:-/usr/local/cuda}"
export LD_LIBRARY_PATH="$here/lib:$cuda/lib64:$cuda/lib:$cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$here/bin:$PATH"
# The golden data the model tests read: the checkout this folder sits in, unless given.
if [ -z "${SCALELAB_SOURCE_DIR:-}" ] && [ -d "$here/../tests/golden/data" ]; then
  export SCALELAB_SOURCE_DIR="$(cd "$here/.." && pwd)"
fi
# A library the package leaves to the machine (NCCL, cuBLASLt) that is not in its CUDA folder: look
# where Python's CUDA wheels put them (PyTorch's nvidia-* packages) and add that folder.
missing_libs() { ldd "$here/bin/scalelab" 2>/dev/null | awk '/not found/ {print $1}'; }
for lib in $(missing_libs); do
  found=$(find /opt /usr/local /usr/lib /root/.local -name "$lib" 2>/dev/null | head -1)
  [ -n "$found" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$found")"
done
# Sourced (bench/gpu/run.sh does): the environment above is all it does.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then return 0; fi
if [ "${1:-}" = "--check" ]; then
  status=0
  for b in "$here"/bin/* "$here"/tests/*; do
    missing=$(ldd "$b" | grep "not found" || true)
    if [ -n "$missing" ]; then echo "$(basename "$b"): $missing"; status=1; fi
  done
  [ $status = 0 ] && echo "every library resolves"
  exit $status
fi
[ $# -eq 0 ] && { echo "usage: $0 COMMAND [ARGS...] | --check" >&2; exit 2; }
exec "$@"
ENV
chmod +x "$out/env.sh"

echo "Packed into $out:"
echo "  bin/$(basename "${bins[0]}")"
for b in "${bins[@]:1}"; do echo "  tests/$(basename "$b")"; done
for n in "${!copied[@]}"; do echo "  lib/$n  (${copied[$n]})"; done | sort
if [ ${#left_to_gpu[@]} -gt 0 ]; then
  echo "Left to the GPU machine's CUDA (/usr/local/cuda): $(printf '%s\n' "${left_to_gpu[@]}" | sort -u | tr '\n' ' ')"
fi
# What the GPU machine's own glibc / libstdc++ must provide.
glibc=$(for f in "$out"/bin/* "$out"/tests/* "$out"/lib/*; do objdump -T "$f" 2>/dev/null; done | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
glibcxx=$(for f in "$out"/bin/* "$out"/tests/* "$out"/lib/*; do objdump -T "$f" 2>/dev/null; done | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -1)
echo "Needs on the GPU machine: ${glibc:-GLIBC ?} or newer${glibcxx:+, libstdc++ with $glibcxx or newer (else --bundle-libstdcxx)}, the NVIDIA driver (libcuda.so.1) and CUDA 13 in /usr/local/cuda"
# Which files need the newest glibc: a glibc newer than 2.35 is Debian 12's (Ubuntu 22.04 has 2.35).
if [ -n "$glibc" ]; then
  needers=$(for f in "$out"/bin/* "$out"/tests/* "$out"/lib/*; do
               if objdump -T "$f" 2>/dev/null | grep -F "($glibc)" >/dev/null; then basename "$f"; fi
             done | tr '\n' ' ')
  echo "  $glibc is needed by: $needers"
  if [ "$(printf '%s\n' GLIBC_2.35 "$glibc" | sort -V | tail -1)" != GLIBC_2.35 ]; then
    echo "package-device.sh: warning: $glibc is newer than Ubuntu 22.04's 2.35; on such a GPU machine the binaries" \
         "will not load (Open MPI's libevent needs arc4random from 2.36: configure with -DSCALELAB_WITH_MPI=OFF" \
         "-DSCALELAB_WITH_NCCL=OFF for the package, or use a GPU machine with glibc >= ${glibc#GLIBC_})" >&2
  fi
fi
for l in $(printf '%s\n' "${left_to_gpu[@]}" | sort -u); do
  case "$l" in libnccl.so*) echo "  note: $l must be on the GPU machine (the CUDA toolkit does not always ship NCCL; else configure with -DSCALELAB_WITH_NCCL=OFF); check with: $out/env.sh --check" ;; esac
done
size=$(du -sb "$out" | cut -f1)
echo "Total: $(du -sh "$out" | cut -f1) ($size bytes)"
if [ "$make_tar" = 1 ]; then
  tar cJf "$out.tar.xz" -C "$(dirname "$out")" "$(basename "$out")"
  echo "Archive: $out.tar.xz ($(du -sh "$out.tar.xz" | cut -f1)); on the GPU machine: tar xJf $out.tar.xz"
elif [ "$size" -gt $((60 * 1024 * 1024)) ]; then
  echo "package-device.sh: warning: above 60 MiB (the device machine's transfer limit is 64 MiB): use --tar" >&2
fi
