#!/usr/bin/env bash
# Configures BUILD_DIR as scripts/sanitize.sh and scripts/fuzz.sh both build it: the `sanitize`
# preset (ASan and UBSan, every report fatal; CPU only) with clang at -O1 with line tables (-g1,
# several times faster to compile than -O2 -g), the libraries instrumented for libFuzzer's
# coverage (fuzzer-no-link; the ASan runtime provides its hooks) and the fuzz targets on, so that
# one build serves the sanitized suite and the fuzzers. Installs clang and its runtimes if missing.
#   scripts/configure-sanitize.sh build/sanitize
set -euo pipefail
cd "$(dirname "$0")/.."
build=$1

scripts/install-deps.sh clang libclang-rt-14-dev
cxx=$(command -v clang++ || command -v clang++-14)

# A build folder configured with another compiler (say, the plain preset's default) starts over.
if [ -f "$build/CMakeCache.txt" ] && ! grep -qx "CMAKE_CXX_COMPILER:[A-Z]*=$cxx" "$build/CMakeCache.txt"; then
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
fi

cmake --preset sanitize -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link" -DSHARDPLAN_FUZZ=ON >/dev/null
