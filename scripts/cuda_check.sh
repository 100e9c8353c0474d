#!/usr/bin/env bash
# Builds dtensor against the LibTorch of this machine's python3 and runs the CUDA tests (tests/cuda).
# For a GPU machine that lacks ./dev's setup: its own torch (2.11 or newer) is used as is, with the
# NCCL path on. DEPS_PREFIX may name a folder laid out like /usr holding what Debian gives ./dev
# (gloo, gtest, gmock, nlohmann and zlib headers, gtest's static libraries and CMake files).
# Usage: [DEPS_PREFIX=dir] [BUILD=dir] scripts/cuda_check.sh [gtest args...]
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-/tmp/dtensor-cuda-build}
PYTHON=${PYTHON:-python3}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || exit 1
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' || exit 1
TORCH_DIR=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
TORCH_ABI=$("$PYTHON" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
header_dir() {  # the folder holding header $1: the CUDA toolkit first (whole), then the wheel's nvidia packages
  local found
  found=$(find -L /usr/local/cuda/include "$TORCH_DIR/../nvidia" -name "$1" -print -quit 2>/dev/null)
  [[ -n "$found" ]] && dirname "$found"
}
CUDA_INCLUDE=$(header_dir cuda_runtime_api.h)
NCCL_INCLUDE=$(header_dir nccl.h)
echo "LibTorch $TORCH_DIR (ABI $TORCH_ABI); CUDA headers ${CUDA_INCLUDE:-none}; NCCL headers ${NCCL_INCLUDE:-none}; $(c++ --version | head -1)"

generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$ROOT" -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DDTENSOR_TORCH_DIR="$TORCH_DIR" -DDTENSOR_TORCH_CXX11_ABI="$TORCH_ABI" -DDTENSOR_PYTHON="$(command -v "$PYTHON")" \
  -DDTENSOR_BUILD_BENCH=OFF -DDTENSOR_WITH_MPI=OFF -DDTENSOR_MPIRUN="$(command -v mpirun || echo /bin/false)" \
  -DDTENSOR_WITH_NCCL=ON -DDTENSOR_CUDA_INCLUDE_DIR="$CUDA_INCLUDE" -DDTENSOR_NCCL_INCLUDE_DIR="$NCCL_INCLUDE" \
  ${DEPS_PREFIX:+-DCMAKE_PREFIX_PATH="$DEPS_PREFIX"} >"$BUILD.configure.log" 2>&1 \
  || { tail -40 "$BUILD.configure.log"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" --target dtensor_cuda_tests 2>&1 | grep -E "error|FAILED|warning: unused" | head -60
[[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "build failed"; exit 1; }
DTENSOR_TIMEOUT_S=${DTENSOR_TIMEOUT_S:-120} timeout 600 "$BUILD/tests/dtensor_cuda_tests" "$@"
