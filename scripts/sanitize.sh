#!/usr/bin/env bash
# Builds the project and its tests with AddressSanitizer and UndefinedBehaviorSanitizer (the
# `sanitize` preset of CMakePresets.json: clang, CPU only, no benchmarks; the libraries are also
# instrumented for libFuzzer, so scripts/fuzz.sh fuzzes from this build without compiling again)
# and runs the whole ctest suite under them, the MPI tests and the fuzz regression replays
# included. Any sanitizer report fails the test that made it. The test presets carry the
# sanitizers' settings: `sanitize` every test but the MPI ones, `sanitize-mpi` those, with Open
# MPI's own leaks suppressed (scripts/lsan-openmpi.supp).
#   SANITIZE_JOBS=2 scripts/sanitize.sh
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${SANITIZE_JOBS:-$(nproc)}

cmake --preset sanitize >/dev/null
cmake --build --preset sanitize -j "$jobs"

status=0
ctest --preset sanitize -j "$jobs" || status=1
ctest --preset sanitize-mpi -j "$jobs" || status=1
exit "$status"
