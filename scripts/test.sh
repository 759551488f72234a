#!/usr/bin/env bash
# Quick start, second command: install what the build needs when something is missing (once),
# build, then run the whole test suite through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
full=${SHARDPLAN_FULL_CHECKS:-1}
if [[ "$full" == 1 ]]; then
  scripts/install-deps.sh clang libclang-rt-14-dev # the sanitizer and fuzz builds' compiler
else
  scripts/install-deps.sh
fi
scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --preset release -j "$(nproc)"
# Then the suite again under AddressSanitizer and UndefinedBehaviorSanitizer (build/sanitize), and
# every document parser fuzzed from that same build for FUZZ_SECONDS each. SHARDPLAN_FULL_CHECKS=0
# skips both (the release suite alone, for a quick check while editing).
if [[ "$full" == 1 ]]; then
  scripts/sanitize.sh
  FUZZ_SECONDS="${FUZZ_SECONDS:-10}" scripts/fuzz.sh
fi
