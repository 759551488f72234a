#!/usr/bin/env python3
"""Which folders' headers each folder's sources include, read from the quoted #include lines.

Usage: scripts/include_graph.py [--files] [FOLDER ...]
  prints "folder -> included folder (count)" for every pair; with --files, each including file too.
  Folders default to every top-level folder with C++ sources (tests/ split by its subfolders).
"""
import collections
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = (".cpp", ".hpp", ".cu", ".cuh", ".h")


def folder_of(path):
    """tests/executor/x.cpp -> tests/executor, executor/cuda/x.cu -> executor/cuda."""
    parts = path.split("/")
    if parts[0] == "tests" and len(parts) > 2:
        return "/".join(parts[:2])
    if len(parts) > 2 and parts[1] == "cuda":
        return "/".join(parts[:2])
    return parts[0]


def source_files():
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "build"]
        for name in filenames:
            if name.endswith(SOURCES):
                yield os.path.relpath(os.path.join(dirpath, name), ROOT)


def include_edges():
    """{(folder, included folder): [files]} for includes that name a path in the tree."""
    edges = collections.defaultdict(list)
    for path in sorted(source_files()):
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
            text = f.read()
        here = folder_of(path)
        for target in INCLUDE.findall(text):
            if "/" not in target or not os.path.exists(os.path.join(ROOT, target)):
                continue  # a neighbour in the same folder, or a test helper by its short name
            there = folder_of(target)
            if there != here:
                edges[(here, there)].append(path)
    return edges


def main(argv):
    show_files = "--files" in argv
    only = [a.rstrip("/") for a in argv if not a.startswith("--")]
    for (here, there), files in sorted(include_edges().items()):
        if only and here not in only:
            continue
        print(f"{here} -> {there} ({len(files)})")
        if show_files:
            for f in sorted(set(files)):
                print(f"    {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
