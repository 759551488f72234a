#!/usr/bin/env bash
# Builds the project and its tests with AddressSanitizer and UndefinedBehaviorSanitizer (the
# `sanitize` preset of CMakePresets.json: CPU only, no benchmarks) and runs the whole ctest suite
# under them, the MPI tests and the fuzz regression replays included. Any sanitizer report fails the
# test that made it.
#
# It builds with clang at -O1 with line tables (-g1): several times faster to compile than -O2 -g,
# and the same configuration as scripts/fuzz.sh, so that `FUZZ_BUILD_DIR=build/sanitize
# scripts/fuzz.sh` fuzzes from this build without compiling anything again.
#   SANITIZE_BUILD_DIR=build/other scripts/sanitize.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build=${SANITIZE_BUILD_DIR:-build/sanitize}
jobs=${SANITIZE_JOBS:-$(nproc)}

scripts/install-deps.sh
missing=()
for p in clang libclang-rt-14-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
cxx=$(command -v clang++ || command -v clang++-14)

# A build folder configured with another compiler (say, the plain preset's default) starts over.
if [ -f "$build/CMakeCache.txt" ] && ! grep -qx "CMAKE_CXX_COMPILER:[A-Z]*=$cxx" "$build/CMakeCache.txt"; then
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
fi

# The libraries also get libFuzzer's coverage instrumentation (fuzzer-no-link; the ASan runtime
# provides its hooks), which the fuzz targets (SHARDPLAN_FUZZ) need.
cmake --preset sanitize -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link" -DSHARDPLAN_FUZZ=ON >/dev/null
cmake --build "$build" -j "$jobs"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
ctest --test-dir "$build" -j "$jobs" --output-on-failure -LE mpi || status=1
# The MPI tests: Open MPI keeps what MPI_Init allocated until exit, which LeakSanitizer reports in
# every rank. Those leaks (and only those: scripts/lsan-openmpi.supp) are suppressed; unwinding
# without frame pointers (fast_unwind_on_malloc=0) lets LeakSanitizer see the MPI frames.
LSAN_OPTIONS="suppressions=$PWD/scripts/lsan-openmpi.supp:fast_unwind_on_malloc=0" \
  ctest --test-dir "$build" -j "$jobs" --output-on-failure -L mpi --no-tests=ignore || status=1
exit "$status"
