#!/usr/bin/env bash
# Gathers, from this machine's Debian packages (./dev installs them), what scripts/cuda_check.sh needs
# on a GPU machine that has its own torch but not these: gloo, gtest, gmock, nlohmann-json and zlib
# headers, gtest's static libraries and CMake files, laid out like /usr under DIR (4 MB).
# Usage: scripts/cuda_check_deps.sh DIR; then on the GPU machine: DEPS_PREFIX=DIR/usr scripts/cuda_check.sh
set -euo pipefail
DIR=${1:?usage: $0 DIR}
LIB=usr/lib/x86_64-linux-gnu
mkdir -p "$DIR/usr/include" "$DIR/$LIB/cmake"
cp -r /usr/include/gloo /usr/include/gtest /usr/include/gmock /usr/include/nlohmann /usr/include/zlib.h /usr/include/zconf.h "$DIR/usr/include/"
cp /$LIB/libgtest.a /$LIB/libgtest_main.a /$LIB/libgmock.a /$LIB/libgmock_main.a "$DIR/$LIB/"
cp -L /$LIB/libz.so "$DIR/$LIB/libz.so"
cp -r /$LIB/cmake/GTest "$DIR/$LIB/cmake/"
echo "$DIR: $(du -sh "$DIR" | cut -f1)"
