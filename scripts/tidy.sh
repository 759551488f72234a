#!/usr/bin/env bash
# clang-tidy 14 (the checks of .clang-tidy) over the C++ sources of a build's compile database
# (scripts/tidy.py does the work; its comment says how):
#   scripts/tidy.sh [JOBS]             every translation unit (a full compile's worth of parsing with
#                                      analysis on top: tens of minutes); exits 1 on any finding
#   scripts/tidy.sh --record [JOBS]    the same, then writes tests/style/tidy_clean.sha256, the files
#                                      it verified clean
#   scripts/tidy.sh --update [JOBS]    --changed, then adds the files it verified clean to that list
#   scripts/tidy.sh --changed [JOBS]   only the units of files that differ from that list (ctest's
#                                      style::clang_tidy)
# JOBS: default the number of CPUs. TIDY_BUILD_DIR: the build tree (default build/release,
# configured when it has no compile_commands.json). Exits 77 (ctest's "skipped") without
# clang-tidy-14: another major version finds other things.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=()
if [[ "${1:-}" == --record || "${1:-}" == --changed || "${1:-}" == --update ]]; then
  mode=("$1")
  shift
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
