#!/usr/bin/env bash
# clang-tidy (the checks of .clang-tidy) over every C++ source of the release build
# (build/release/compile_commands.json); exits 1 on any finding, printing them.
# Usage: scripts/tidy.sh [JOBS] (default: the number of CPUs). Not part of scripts/test.sh: it
# takes minutes (a full compile's worth of parsing, with analysis on top).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${1:-$(nproc)}
tidy=$(command -v clang-tidy-14 || command -v clang-tidy || true)
runner=$(command -v run-clang-tidy-14 || command -v run-clang-tidy || true)
if [[ -z "$tidy" || -z "$runner" ]]; then
  echo "tidy.sh: clang-tidy and run-clang-tidy not found (apt-get install clang-tidy-14)" >&2
  exit 2
fi
if [[ ! -f build/release/compile_commands.json ]]; then
  cmake --preset release >/dev/null
fi
# The sources of the project's own folders (not the CUDA files, which clang-tidy would compile as
# C++ without nvcc's flags).
files='/(core|costmodel|comm|kernels|executor|planner|calibrate|bench|tests)/.*\.cpp$'
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$runner" -clang-tidy-binary "$tidy" -p build/release -j "$jobs" -quiet "$files" 2>&1 |
  sed -e 's/\x1b\[[0-9;]*m//g' >"$log" || true  # without the colours
# A finding is a "file:line:col: warning|error:" line; the runner's own progress lines are not.
if grep -qE '^[^ ]+:[0-9]+:[0-9]+: (warning|error):' "$log"; then
  grep -E '^[^ ]+:[0-9]+:[0-9]+: (warning|error):' "$log" | sort -u
  echo "tidy.sh: $(grep -cE '^[^ ]+:[0-9]+:[0-9]+: (warning|error):' "$log" | tr -d ' ') findings" >&2
  exit 1
fi
echo "tidy.sh: no findings"
