#!/usr/bin/env python3
"""Lists the functions and doctest TEST_CASEs longer than a limit (default 80 lines), longest first.

Usage: scripts/long_functions.py [LIMIT]   (from the repository root; needs universal-ctags)

The files are the tracked C++ and CUDA sources under the project's folders (git ls-files), so a
virtual environment or a build tree inside the checkout is not read. Exits 77 (ctest's "skipped")
without ctags or outside a git checkout.

A function left long on purpose carries a comment starting "Left whole:" in the lines just above
it; those are listed with "(reason given)". A source file outside tests/ over FILE_LIMIT (800)
lines says why in its first lines, a comment starting "Over 800 lines:". The exit status is 1
when a long function or file has no reason.
"""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

SUFFIXES = (".cpp", ".hpp", ".h", ".cu", ".cuh")
FILE_LIMIT = 800
FILE_REASON = re.compile(r"^\s*(//|#) Over 800 lines:")

ROOTS = ["bench", "calibrate", "comm", "core", "costmodel", "documents", "executor", "kernels", "planner",
         "tests", "validation"]


def has_reason(lines, start):
    """A "Left whole:" comment among the lines above `start` (1-based), up to the code before it."""
    for line in reversed(lines[max(0, start - 8):start - 1]):
        text = line.strip()
        if text.startswith("// Left whole:"):
            return True
        if text and not text.startswith(("//", "template", "__global__")):
            return False
    return False


def tracked_sources():
    """The tracked C++ and CUDA files under ROOTS, or None outside a git checkout."""
    listed = subprocess.run(["git", "ls-files", "--"] + ROOTS, capture_output=True, text=True)
    if listed.returncode != 0:
        return None
    return [f for f in listed.stdout.splitlines() if f.endswith(SUFFIXES) and Path(f).is_file()]


def functions(files):
    out = subprocess.run(["ctags", "--languages=C++", "--langmap=C++:+.cu.cuh", "--kinds-C++=f",
                          "--fields=+ne", "--output-format=json", "-L", "-", "-f", "-"],
                         input="\n".join(files), capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        tag = json.loads(line)
        if "end" in tag:
            name = f'{tag["scope"]}::{tag["name"]}' if tag.get("scope") else tag["name"]
            yield tag["path"], tag["line"], tag["end"], name


def test_cases(files):
    for name in files:
        if name.endswith(".cpp"):
            path = Path(name)
            lines = path.read_text(errors="replace").split("\n")
            for i, line in enumerate(lines):
                if not re.match(r"\s*TEST_CASE\(", line):
                    continue
                depth, opened = 0, False
                for k in range(i, len(lines)):
                    depth += lines[k].count("{") - lines[k].count("}")
                    opened = opened or "{" in lines[k]
                    if opened and depth <= 0:
                        yield str(path), i + 1, k + 1, line.strip()[:60]
                        break


def main():
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 80
    files = tracked_sources()
    if files is None or shutil.which("ctags") is None:
        print("long_functions.py: needs universal-ctags and a git checkout", file=sys.stderr)
        return 77
    rows = []
    for path, start, end, name in list(functions(files)) + list(test_cases(files)):
        if end - start + 1 > limit:
            lines = Path(path).read_text(errors="replace").split("\n")
            rows.append((end - start + 1, path, start, name, has_reason(lines, start)))
    unexplained = 0
    for n, path, start, name, reason in sorted(rows, reverse=True):
        print(f"{n:5d}  {path}:{start}  {name}{'  (reason given)' if reason else ''}")
        unexplained += not reason
    for n, path, reason in long_files(files):
        print(f"{n:5d}  {path}  (the file){'  (reason given)' if reason else ''}")
        unexplained += not reason
    return 1 if unexplained else 0


def long_files(files):
    """The sources outside tests/ over FILE_LIMIT lines, with whether their first lines say why."""
    python = subprocess.run(["git", "ls-files", "--", "*.py"], capture_output=True, text=True)
    for name in sorted(set(files) | set(python.stdout.splitlines())):
        if name.startswith("tests/") or not Path(name).is_file():
            continue
        lines = Path(name).read_text(errors="replace").splitlines()
        if len(lines) > FILE_LIMIT:
            yield len(lines), name, any(FILE_REASON.match(line) for line in lines[:20])


if __name__ == "__main__":
    sys.exit(main())
