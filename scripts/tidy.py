#!/usr/bin/env python3
"""clang-tidy 14 (the checks of .clang-tidy) over the project's C++ translation units: all of them,
or those a change since a git revision can affect. Run it through scripts/tidy.sh.

  tidy.py [--jobs N] [--build DIR]              every translation unit of DIR's compile database
                                                that .ci/tidy-clean does not record as checked
                                                clean with the same inputs (unit_keys)
  tidy.py --all [--jobs N] [--build DIR]        every translation unit
  tidy.py --record [--jobs N] [--build DIR]     as the first, then .ci/tidy-clean written anew
  tidy.py --since REV [--jobs N] [--build DIR]  the units whose own text, or a project header they
                                                include (directly or through other headers),
                                                differs between the merge base of HEAD and REV
                                                and the working tree (untracked files too); every
                                                unit when .clang-tidy differs

Prints each finding once ("path:line:col: warning: ... [check]", paths from the repository root)
and exits 1 when there is any, 0 when there is none.

The database is the build's compile_commands.json without the precompiled header's flags
(cmake/PrecompiledHeaders.cmake): clang-tidy would otherwise load gcc's .gch of cmake_pch.hxx as if
it were clang's and misparse the units (errors such as "implicit instantiation of undefined
template nlohmann::basic_json"), and each unit is checked with the includes it writes itself.
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = ".clang-tidy"
# The units checked clean, each with the SHA-256 of what its check read (unit_keys): a unit whose
# inputs are unchanged is not checked again. Written by --record; a missing or stale line only means
# that unit is checked.
RECORD = ".ci/tidy-clean"
RECORD_HEADER = ("# Written by scripts/tidy.sh --record: the translation units clang-tidy found clean,\n"
                 "# each with the SHA-256 of its inputs (scripts/tidy.py, unit_keys). A unit whose\n"
                 "# inputs differ from its line is checked again.\n")
# The translation units checked: the project's own folders (the folders of HeaderFilterRegex), not
# the CUDA files, which clang-tidy would compile as C++ without nvcc's flags.
UNIT = re.compile(r"/(core|documents|costmodel|comm|kernels|executor|planner|calibrate|bench|tests)/"
                  r".*\.cpp$")
FINDING = re.compile(r"^(\S+?):(\d+):(\d+): (warning|error): (.*)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def rel(path):
    """A path from the repository root, through the build tree's include links; None outside."""
    real = os.path.realpath(path)
    if os.path.commonpath([real, ROOT]) != ROOT:
        return None
    return os.path.relpath(real, ROOT)


# Warning flags of gcc's that clang does not know (cmake/Warnings.cmake sets them for gcc only):
# clang would report each as an unknown warning option, an error under -Werror.
GCC_ONLY_FLAGS = {"-Wno-error=stringop-overflow"}


def without_pch(args):
    """The compile command without cmake_pch.hxx's -include (gcc) or -include-pch (clang), and
    without the gcc-only warning flags."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a == "-Winvalid-pch" or a in GCC_ONLY_FLAGS:
            i += 1
        elif a == "-include" and i + 1 < len(args) and "cmake_pch" in args[i + 1]:
            i += 2
        elif a == "-Xclang" and i + 3 < len(args) and "cmake_pch" in args[i + 3]:
            i += 4  # -Xclang -include-pch -Xclang FILE, -Xclang -include -Xclang FILE
        else:
            out.append(a)
            i += 1
    return out


UNITY_SOURCE = re.compile(r'^#include "([^"]+\.cpp)"$', re.M)


def split_unity(entries):
    """The database's entries with each unity chunk (CMAKE_UNITY_BUILD: Unity/unity_N_cxx.cxx,
    a file of #include lines) replaced by one entry per source it includes, compiled with the
    chunk's command: clang-tidy checks each file as its own unit either way."""
    out = []
    for e in entries:
        path = os.path.normpath(os.path.join(e["directory"], e["file"]))
        if "/Unity/unity_" not in path:
            out.append(e)
            continue
        with open(path, encoding="utf-8") as f:
            sources = UNITY_SOURCE.findall(f.read())
        args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
        for source in sources:
            out.append({"directory": e["directory"], "file": source,
                        "arguments": [source if a == e["file"] or a == path else a for a in args]})
    return out


def database(build):
    """{repository path: absolute path} of the units, the folder of the PCH-free database, and
    {repository path: its compile arguments}."""
    with open(os.path.join(build, "compile_commands.json"), encoding="utf-8") as f:
        entries = split_unity(json.load(f))
    units, kept, arguments = {}, [], {}
    for e in entries:
        path = os.path.normpath(os.path.join(e["directory"], e["file"]))
        if not UNIT.search(path) or rel(path) is None or rel(path) in units:
            continue  # another folder's file, or a second target's (checked once)
        args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
        kept.append({"directory": e["directory"], "file": path, "arguments": without_pch(args)})
        units.setdefault(rel(path), path)
        arguments.setdefault(rel(path), without_pch(args))
    folder = os.path.join(build, "tidy")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "compile_commands.json"), "w", encoding="utf-8") as f:
        json.dump(kept, f, indent=1)
    return units, folder, arguments


def include_graph(files):
    """{file: the repository files its quoted #include lines name} (every #if branch counted)."""
    graph = {}
    for path in files:
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
            names = INCLUDE.findall(f.read())
        found = set()
        for name in names:
            for candidate in (os.path.join(os.path.dirname(path), name), name):
                candidate = os.path.normpath(candidate)
                if os.path.isfile(os.path.join(ROOT, candidate)):
                    found.add(candidate)
                    break
        graph[path] = found
    return graph


def reachable(graph, start):
    """Every file reachable from start through the graph's includes (start only if in a cycle)."""
    seen, todo = set(), [start]
    while todo:
        for name in graph.get(todo.pop(), ()):
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


def includers(units, graph):
    """{header: units that include it directly}, {header: units that reach it at all}."""
    direct, reach = {}, {}
    for unit in units:
        for name in graph.get(unit, ()):
            direct.setdefault(name, set()).add(unit)
        for name in reachable(graph, unit):
            reach.setdefault(name, set()).add(unit)
    return direct, reach


def git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout


def changed_since(rev):
    """The repository files that differ between the merge base of HEAD and rev and the working
    tree, with the untracked ones."""
    base = git("merge-base", "HEAD", rev).strip()
    names = git("diff", "--name-only", base).splitlines()
    names += git("ls-files", "--others", "--exclude-standard").splitlines()
    return {os.path.normpath(n) for n in names}


def units_changed_since(units, rev):
    """{unit: why} of the units a change since rev can affect (the module's comment)."""
    changed = changed_since(rev)
    if CONFIG in changed:
        return {u: f"{CONFIG} changed" for u in units}
    picked = {u: "changed" for u in units if u in changed}
    _, reach = includers(units, include_graph(sorted(project_sources(units))))
    for header in sorted(changed & set(reach)):
        for u in reach[header]:
            picked.setdefault(u, f"includes {header}")
    return picked


def project_sources(units):
    """The units and every header of the project's folders (repository paths)."""
    sources = set(units)
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "build"]
        for name in filenames:
            if name.endswith((".hpp", ".h", ".cuh")):
                sources.add(os.path.relpath(os.path.join(dirpath, name), ROOT))
    return sources


# The system packages whose headers the units include, and CUDA's compiler (its headers' version).
SYSTEM_PACKAGES = ["libstdc++-12-dev", "nlohmann-json3-dev", "libeigen3-dev", "libcli11-dev",
                   "libfmt-dev", "doctest-dev", "libopenmpi-dev"]


def system_headers():
    """The versions of the system headers the units read, as text (what is not found says so)."""
    out = ""
    for command in (["dpkg-query", "-W", *SYSTEM_PACKAGES],
                    [shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc", "--version"]):
        try:
            run = subprocess.run(command, capture_output=True, text=True)
            out += run.stdout + run.stderr
        except OSError as e:
            out += f"{command[0]}: {e.strerror}\n"
    return out


def unit_keys(units, arguments, build, tidy):
    """{unit: the SHA-256 of everything its check reads}: clang-tidy's version, the system headers'
    versions, .clang-tidy, the unit's compile arguments (the repository and build folders written as placeholders), the
    unit's text and the text of every project header it reaches. A unit whose key is in RECORD
    was checked clean with exactly these inputs."""
    version = subprocess.run([tidy, "--version"], capture_output=True, text=True).stdout
    version += system_headers()
    with open(os.path.join(ROOT, CONFIG), "rb") as f:
        config = f.read()
    graph = include_graph(sorted(project_sources(units)))
    keys = {}
    for unit in units:
        h = hashlib.sha256()
        h.update(version.encode())
        h.update(config)
        args = [a.replace(os.path.abspath(build), "<build>").replace(ROOT, "<root>")
                for a in arguments[unit]]
        h.update(json.dumps(args).encode())
        for path in [unit] + sorted(reachable(graph, unit) - {unit}):
            with open(os.path.join(ROOT, path), "rb") as f:
                h.update(path.encode() + b"\0" + f.read() + b"\0")
        keys[unit] = h.hexdigest()
    return keys


def read_record():
    """{key: unit} of RECORD (empty when there is none)."""
    try:
        with open(os.path.join(ROOT, RECORD), encoding="utf-8") as f:
            lines = [line.split() for line in f if line.strip() and not line.startswith("#")]
    except FileNotFoundError:
        return {}
    return {parts[0]: parts[1] for parts in lines if len(parts) == 2}


def write_record(clean):
    """RECORD: one line per unit checked clean, `key unit`, sorted by unit."""
    with open(os.path.join(ROOT, RECORD), "w", encoding="utf-8") as f:
        f.write(RECORD_HEADER)
        for unit, key in sorted(clean.items()):
            f.write(f"{key} {unit}\n")


def check(tidy, db, unit_path):
    """(finding lines, seconds) of one unit."""
    start = time.monotonic()
    run = subprocess.run([tidy, "-p", db, "--quiet", unit_path], capture_output=True, text=True,
                         errors="replace")
    findings = set()
    for line in run.stdout.splitlines():
        m = FINDING.match(line)
        if m:
            where = rel(m.group(1)) or m.group(1)
            findings.add(f"{where}:{m.group(2)}:{m.group(3)}: {m.group(4)}: {m.group(5)}")
    if run.returncode != 0 and not findings:
        tail = run.stderr.splitlines()[-5:]
        findings.add(f"{rel(unit_path)}: error: clang-tidy exited {run.returncode}: " +
                     " / ".join(tail))
    return findings, time.monotonic() - start


def run_all(tidy, db, chosen, jobs):
    """{unit: check()'s result} for the chosen units, jobs at a time, with a progress line each."""
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(check, tidy, db, path): unit for unit, path in chosen.items()}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            unit = futures[future]
            results[unit] = future.result()
            findings, seconds = results[unit]
            state = f"{len(findings)} findings" if findings else "clean"
            print(f"tidy: [{done}/{len(chosen)}] {unit}: {state} ({seconds:.0f} s)",
                  file=sys.stderr, flush=True)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--since", metavar="REV",
                        help="only the units a change since the merge base with REV can affect")
    parser.add_argument("--all", action="store_true",
                        help=f"every unit, whatever {RECORD} says")
    parser.add_argument("--record", action="store_true",
                        help=f"check the units {RECORD} does not hold, then write it anew")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    parser.add_argument("--tidy", default=shutil.which("clang-tidy-14") or "clang-tidy-14")
    args = parser.parse_args()
    units, db, arguments = database(os.path.abspath(args.build))
    keys = unit_keys(units, arguments, args.build, args.tidy)
    recorded = read_record()
    if args.since:
        why = units_changed_since(units, args.since)
        for unit in sorted(why):
            print(f"tidy: checking {unit} ({why[unit]})", file=sys.stderr)
        if not why:
            print(f"tidy: no unit changed since the merge base with {args.since}")
            return 0
    elif args.all:
        why = units
    else:
        why = {u: "" for u in units if recorded.get(keys[u]) != u}
        print(f"tidy: {len(units) - len(why)} of {len(units)} units are as they were when checked "
              f"clean ({RECORD}); checking the other {len(why)}", file=sys.stderr)
    results = run_all(args.tidy, db, {u: units[u] for u in why}, max(1, args.jobs))
    findings = sorted(set().union(*(r[0] for r in results.values())))
    print("\n".join(findings + [f"tidy: {len(findings)} findings in "
                                f"{sum(1 for r in results.values() if r[0])} of {len(results)} units"]))
    if args.record:
        clean = {u: keys[u] for u in units
                 if (u in results and not results[u][0]) or
                 (u not in results and recorded.get(keys[u]) == u)}
        write_record(clean)
        print(f"tidy: {RECORD} holds {len(clean)} of {len(units)} units", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
