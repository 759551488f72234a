#!/usr/bin/env bash
# Quick start, second command: build, then run the whole test suite through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --preset release -j "$(nproc)"
