#!/usr/bin/env bash
# Quick start, second command: build, then run the whole test suite through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --preset release -j "$(nproc)"
# Then the suite again under AddressSanitizer and UndefinedBehaviorSanitizer (build/sanitize), and
# every document parser fuzzed from that same build for FUZZ_SECONDS each. SHARDPLAN_FULL_CHECKS=0
# skips both (the release suite alone, for a quick check while editing).
if [[ "${SHARDPLAN_FULL_CHECKS:-1}" == 1 ]]; then
  scripts/sanitize.sh
  FUZZ_BUILD_DIR=build/sanitize FUZZ_SECONDS="${FUZZ_SECONDS:-10}" scripts/fuzz.sh
fi
