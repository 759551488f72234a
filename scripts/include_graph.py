#!/usr/bin/env python3
"""Which folders' headers each folder's sources include, read from the quoted #include lines.

Usage: scripts/include_graph.py [--files] [FOLDER ...]
  prints "folder -> included folder (count of #include lines)" for every pair; with --files, each
  including file too. Folders: the top-level ones, tests/ split by its subfolders, and cuda/
  subfolders on their own.
       scripts/include_graph.py --check
  exits 1, naming the file and the include, when a folder includes a header of a folder that the
  layers table (cmake/layers.txt) does not list for it (ctest runs this as
  layers::includes_follow_links). The build enforces the same edges (cmake/Layers.cmake), and
  configure checks each target's links against the same table.
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


# The layers table: which folders each folder's sources may use besides its own. configure checks
# the CMake links against the same file (cmake/Layers.cmake).
LAYERS = os.path.join(ROOT, "cmake", "layers.txt")


def read_layers(path=LAYERS):
    """{folder: {folders it may use}} from the table's "folder: folder folder ..." lines."""
    layers = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            here, colon, uses = line.partition(":")
            here = here.strip()
            if not colon or len(here.split()) != 1 or here in layers:
                where = f"{os.path.relpath(path, ROOT)}:{number}"
                if here in layers:
                    raise SystemExit(f"{where}: a second row for {here}")
                raise SystemExit(f'{where}: not "folder: folder folder ..."')
            layers[here] = set(uses.split())
    return layers


def allowed_from(layers, here):
    """The folders `here` may include: a test folder, its library's and the library itself."""
    if here in layers:
        return layers[here]
    if here.startswith("tests/"):
        lib = here.split("/", 1)[1]
        if lib in layers:
            cuda = {lib + "/cuda"} | layers.get(lib + "/cuda", set())
            return {"tests", lib} | layers[lib] | cuda
    return None


def check():
    layers = read_layers()
    bad = 0
    for (here, there), files in sorted(include_edges().items()):
        allowed = allowed_from(layers, here)
        if allowed is None:
            print(f"include_graph.py: {here}/ is not in the layers table (cmake/layers.txt)")
            bad += 1
        elif there not in allowed:
            for f in sorted(set(files)):
                print(f"{f}: includes a header of {there}/, which {here}/ may not use")
                bad += 1
    if bad == 0:
        print("include_graph.py: every include follows the layers")
    return 1 if bad else 0


def main(argv):
    if "--check" in argv:
        return check()
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
