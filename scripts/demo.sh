#!/usr/bin/env bash
# Quick start, first command: build, then run the main job on its built-in default.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >&2
exec build/release/planner/planner recommend "$@"
