#!/usr/bin/env bash
# Builds the project and its tests with AddressSanitizer and UndefinedBehaviorSanitizer (the
# `sanitize` preset of CMakePresets.json: CPU only, no benchmarks) and runs the whole ctest suite
# under them, the MPI tests and the fuzz regression replays included. Any sanitizer report fails the
# test that made it.
#
# It is configured by scripts/configure-sanitize.sh, as scripts/fuzz.sh is, so that
# `FUZZ_BUILD_DIR=build/sanitize scripts/fuzz.sh` fuzzes from this build without compiling anything
# again.
#   SANITIZE_BUILD_DIR=build/other scripts/sanitize.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build=${SANITIZE_BUILD_DIR:-build/sanitize}
jobs=${SANITIZE_JOBS:-$(nproc)}

scripts/configure-sanitize.sh "$build"
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
