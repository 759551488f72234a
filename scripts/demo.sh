#!/usr/bin/env bash
# Quick start, first command: install what the build needs when something is missing (once),
# build the planner (only what its answer needs: the cost model's libraries and the program, not
# the tests, the executor or calibrate), then run the main job on its built-in default.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh >&2
scripts/build.sh planner >&2
exec build/release/planner/planner recommend "$@"
