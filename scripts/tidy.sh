#!/usr/bin/env bash
# clang-tidy 14 (the checks of .clang-tidy) over the C++ sources of a build's compile database
# (scripts/tidy.py does the work; its comment says how):
#   scripts/tidy.sh [JOBS]              every translation unit but those .ci/tidy-clean records as
#                                       checked clean with the same inputs (what CI runs); exits 1
#                                       on any finding
#   scripts/tidy.sh --record [JOBS]     the same, then .ci/tidy-clean written anew (commit it with
#                                       the change: CI then checks only what changed since)
#   scripts/tidy.sh --all [JOBS]        every translation unit (about 10 minutes on two cores)
#   scripts/tidy.sh --since REV [JOBS]  only the units whose text or included project headers
#                                       changed since the merge base with REV (e.g. origin/main),
#                                       uncommitted changes included: the check while editing
# JOBS: default the number of CPUs. TIDY_BUILD_DIR: the build tree (default build/release,
# configured when it has no compile_commands.json). Exits 77 without clang-tidy-14: another major
# version finds other things.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=()
if [[ "${1:-}" == --all || "${1:-}" == --record ]]; then
  mode=("$1")
  shift
elif [[ "${1:-}" == --since ]]; then
  if [[ $# -lt 2 ]]; then
    echo "tidy.sh: --since needs a git revision (e.g. origin/main)" >&2
    exit 2
  fi
  mode=(--since "$2")
  shift 2
fi
jobs=${1:-$(nproc)}
build=${TIDY_BUILD_DIR:-build/release}
tidy=$(command -v clang-tidy-14 || true)
if [[ -z "$tidy" ]] || ! command -v python3 >/dev/null; then
  echo "tidy.sh: needs clang-tidy-14 (apt-get install clang-tidy-14) and python3" >&2
  exit 77
fi
if [[ ! -f "$build/compile_commands.json" ]]; then
  if [[ "$build" != build/release ]]; then
    echo "tidy.sh: $build has no compile_commands.json" >&2
    exit 2
  fi
  cmake --preset release >/dev/null
fi
exec python3 scripts/tidy.py "${mode[@]}" --jobs "$jobs" --build "$build" --tidy "$tidy"
