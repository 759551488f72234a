#!/usr/bin/env bash
# Configures and builds the release preset (build/release): everything, or only the targets named
# (scripts/build.sh planner). The packages the build needs are installed by the Quick start's
# scripts (scripts/demo.sh, scripts/test.sh) when one is missing, or by hand:
# scripts/install-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset release >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build --preset release -j "$(nproc)" "${targets[@]}"
