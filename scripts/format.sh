#!/usr/bin/env bash
# clang-format 14 (the style of .clang-format) over every tracked C++ and CUDA source.
#   scripts/format.sh           rewrites the files in place
#   scripts/format.sh --check   changes nothing; lists the files that differ and exits 1 if any
# Exits 77 (ctest's "skipped") without clang-format-14 or outside a git checkout: another major
# version of clang-format formats differently, and the file list comes from git.
set -euo pipefail
cd "$(dirname "$0")/.."
format=$(command -v clang-format-14 || true)
if [[ -z "$format" ]] || ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "format.sh: needs clang-format-14 (apt-get install clang-format-14) and a git checkout" >&2
  exit 77
fi
mapfile -t files < <(git ls-files -- '*.cpp' '*.hpp' '*.cu' '*.cuh' '*.h')
if [[ "${1:-}" == "--check" ]]; then
  # One run over every file; a file that differs shows as "FILE:LINE:COL: error: code should be
  # clang-formatted".
  mapfile -t differ < <(printf '%s\0' "${files[@]}" |
    xargs -0 "$format" --dry-run -Werror 2>&1 | sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error: .*/\1/p' | sort -u)
  if ((${#differ[@]})); then
    printf '%s\n' "${differ[@]}"
    echo "format.sh: ${#differ[@]} of ${#files[@]} files differ from .clang-format (scripts/format.sh fixes them)" >&2
    exit 1
  fi
  echo "format.sh: ${#files[@]} files follow .clang-format"
else
  printf '%s\0' "${files[@]}" | xargs -0 -n 40 "$format" -i
fi
