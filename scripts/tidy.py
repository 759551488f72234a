#!/usr/bin/env python3
"""clang-tidy 14 (the checks of .clang-tidy) over the project's C++ translation units: all of them,
or only those a change since the last clean whole run can affect. Run it through scripts/tidy.sh.

  tidy.py [--jobs N] [--build DIR]            every translation unit of DIR's compile database
  tidy.py --record [--jobs N] [--build DIR]   the same, then writes MANIFEST (below)
  tidy.py --changed [--jobs N] [--build DIR]  only the units of the files that differ from MANIFEST
  tidy.py --update [--jobs N] [--build DIR]   --changed, then adds what it verified clean to
                                              MANIFEST (the entries still current are kept)

Prints each finding once ("path:line:col: warning: ... [check]", paths from the repository root)
and exits 1 when there is any, 0 when there is none.

MANIFEST, tests/style/tidy_clean.sha256 (sha256sum's format, so `sha256sum -c` reads it), holds
the sha256 of every file the last --record run verified clean: .clang-tidy itself, each
translation unit without a finding, and each header that such a unit parsed and that
HeaderFilterRegex lets clang-tidy report on. A unit with a finding, and a file changed while the
run went on, are left out. --changed checks:
  - a translation unit whose file is not in MANIFEST with its current sha256;
  - for such a header, its own .cpp and the units that include it (those that include it
    directly; when none does, those that include it through other headers);
  - every unit when .clang-tidy differs.
A header's change can still change what clang-tidy finds in an unchanged unit that reaches it only
through other headers; the next whole run (--record) sees that.

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
MANIFEST = "tests/style/tidy_clean.sha256"
CONFIG = ".clang-tidy"
# The translation units checked: the project's own folders (the folders of HeaderFilterRegex), not
# the CUDA files, which clang-tidy would compile as C++ without nvcc's flags.
UNIT = re.compile(r"/(core|costmodel|comm|kernels|executor|planner|calibrate|bench|tests)/.*\.cpp$")
FINDING = re.compile(r"^(\S+?):(\d+):(\d+): (warning|error): (.*)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
HEADER_SHOWN = re.compile(r"^\.+ (\S+)$")  # clang -H: one dot per include depth, then the path


def rel(path):
    """A path from the repository root, through the build tree's include links; None outside."""
    real = os.path.realpath(path)
    if os.path.commonpath([real, ROOT]) != ROOT:
        return None
    return os.path.relpath(real, ROOT)


def header_filter():
    with open(os.path.join(ROOT, CONFIG), encoding="utf-8") as f:
        found = re.search(r"^HeaderFilterRegex:\s*'([^']*)'", f.read(), re.M)
    return re.compile(found.group(1) if found else "$^")


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
    """{repository path: absolute path} of the units, and the folder of the PCH-free database."""
    with open(os.path.join(build, "compile_commands.json"), encoding="utf-8") as f:
        entries = split_unity(json.load(f))
    units, kept = {}, []
    for e in entries:
        path = os.path.normpath(os.path.join(e["directory"], e["file"]))
        if not UNIT.search(path) or rel(path) is None or rel(path) in units:
            continue  # another folder's file, or a second target's (checked once)
        args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
        kept.append({"directory": e["directory"], "file": path, "arguments": without_pch(args)})
        units.setdefault(rel(path), path)
    folder = os.path.join(build, "tidy")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "compile_commands.json"), "w", encoding="utf-8") as f:
        json.dump(kept, f, indent=1)
    return units, folder


def sha256(path):
    try:
        with open(os.path.join(ROOT, path), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def read_manifest():
    try:
        with open(os.path.join(ROOT, MANIFEST), encoding="utf-8") as f:
            return dict(reversed(line.rstrip("\n").split("  ", 1)) for line in f if "  " in line)
    except FileNotFoundError:
        return {}


def headers(filter_re):
    """The headers clang-tidy reports on (HeaderFilterRegex), from the repository root."""
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "build"]
        for name in filenames:
            path = os.path.relpath(os.path.join(dirpath, name), ROOT)
            if filter_re.search("/" + path):
                yield path


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


def includers(units, graph):
    """{header: units that include it directly}, {header: units that reach it at all}."""
    direct, reach, memo = {}, {}, {}

    def closure(path, seen):
        if path in memo:
            return memo[path]
        seen.add(path)
        out = set()
        for name in graph.get(path, ()):
            out.add(name)
            if name not in seen:
                out |= closure(name, seen)
        memo[path] = out
        return out

    for unit in units:
        for name in graph.get(unit, ()):
            direct.setdefault(name, set()).add(unit)
        for name in closure(unit, set()):
            reach.setdefault(name, set()).add(unit)
    return direct, reach


def changed_units(units, filter_re, manifest):
    """The units --changed checks, each with why; and the changed headers no unit includes."""
    if manifest.get(CONFIG) != sha256(CONFIG):
        return {u: ".clang-tidy differs from the manifest's" for u in units}, []
    picked = {u: "changed" for u in units if manifest.get(u) != sha256(u)}
    changed = sorted(h for h in headers(filter_re) if manifest.get(h) != sha256(h))
    if not changed:
        return picked, []
    sources = set(units)
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "build"]
        for name in filenames:
            if name.endswith((".hpp", ".h", ".cuh")):
                sources.add(os.path.relpath(os.path.join(dirpath, name), ROOT))
    direct, reach = includers(units, include_graph(sorted(sources)))
    unreached = []
    for h in changed:
        own = os.path.splitext(h)[0] + ".cpp"
        chosen = (({own} & set(units)) | direct.get(h, set())) or reach.get(h, set())
        if not chosen:
            unreached.append(h)
        for u in chosen:
            picked.setdefault(u, f"includes {h}")
    return picked, unreached


def check(tidy, db, unit_path):
    """(finding lines, headers it parsed, whether clang-tidy ran cleanly, seconds) of one unit."""
    start = time.monotonic()
    run = subprocess.run([tidy, "-p", db, "--quiet", "--extra-arg=-H", unit_path],
                         capture_output=True, text=True, errors="replace")
    findings = set()
    for line in run.stdout.splitlines():
        m = FINDING.match(line)
        if m:
            where = rel(m.group(1)) or m.group(1)
            findings.add(f"{where}:{m.group(2)}:{m.group(3)}: {m.group(4)}: {m.group(5)}")
    parsed = set()
    for line in run.stderr.splitlines():
        m = HEADER_SHOWN.match(line)
        if m and rel(m.group(1)):
            parsed.add(rel(m.group(1)))
    if run.returncode != 0 and not findings:
        tail = [l for l in run.stderr.splitlines() if not HEADER_SHOWN.match(l)][-5:]
        findings.add(f"{rel(unit_path)}: error: clang-tidy exited {run.returncode}: " +
                     " / ".join(tail))
    return findings, parsed, run.returncode == 0, time.monotonic() - start


def run_all(tidy, db, chosen, jobs):
    """{unit: check()'s result} for the chosen units, jobs at a time, with a progress line each."""
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(check, tidy, db, path): unit for unit, path in chosen.items()}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            unit = futures[future]
            results[unit] = future.result()
            findings, _, _, seconds = results[unit]
            state = f"{len(findings)} findings" if findings else "clean"
            print(f"tidy: [{done}/{len(chosen)}] {unit}: {state} ({seconds:.0f} s)",
                  file=sys.stderr, flush=True)
    return results


def record(results, before, filter_re, kept_from=None):
    """Writes MANIFEST: the files the run verified clean that did not change while it ran, and
    (kept_from, a manifest) that manifest's entries whose files are still as it says and that no
    finding of this run names."""
    verified = {CONFIG}
    if kept_from:
        named = {line.split(":", 1)[0] for r in results.values() for line in r[0]}
        checked = set(results)
        verified |= {p for p, digest in kept_from.items()
                     if p in before and before[p] == digest and p not in named | checked}
    for unit, (findings, parsed, ok, _) in results.items():
        if not findings and ok:
            verified.add(unit)
            verified |= {h for h in parsed if filter_re.search("/" + h)}
    verified &= before.keys()  # not a file generated in the build tree
    moved = sorted(p for p in verified if sha256(p) != before[p])
    for p in moved:
        print(f"tidy: {p} changed during the run; not recorded", file=sys.stderr)
    kept = sorted(verified - set(moved))
    os.makedirs(os.path.dirname(os.path.join(ROOT, MANIFEST)), exist_ok=True)
    with open(os.path.join(ROOT, MANIFEST), "w", encoding="utf-8") as f:
        f.writelines(f"{before[p]}  {p}\n" for p in kept)
    print(f"tidy: recorded {len(kept)} verified files in {MANIFEST}", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--record", action="store_true")
    mode.add_argument("--changed", action="store_true")
    mode.add_argument("--update", action="store_true")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    parser.add_argument("--tidy", default=shutil.which("clang-tidy-14") or "clang-tidy-14")
    args = parser.parse_args()
    filter_re = header_filter()
    units, db = database(os.path.abspath(args.build))
    manifest = read_manifest()
    if args.changed or args.update:
        why, unreached = changed_units(units, filter_re, manifest)
        for h in unreached:
            print(f"tidy: {h} differs from {MANIFEST}; no unit of this build includes it",
                  file=sys.stderr)
        for unit in sorted(why):
            print(f"tidy: checking {unit} ({why[unit]})", file=sys.stderr)
        if not why:
            print(f"tidy: every unit as the last whole run verified it ({MANIFEST})")
            return 0
    else:
        why = units
    before = {p: sha256(p) for p in [CONFIG, *units, *headers(filter_re)]}
    results = run_all(args.tidy, db, {u: units[u] for u in why}, max(1, args.jobs))
    findings = sorted(set().union(*(r[0] for r in results.values())))
    if args.record:
        record(results, before, filter_re)
    elif args.update:
        record(results, before, filter_re, kept_from=manifest)
    print("\n".join(findings + [f"tidy: {len(findings)} findings in "
                                f"{sum(1 for r in results.values() if r[0])} of {len(results)} units"]))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
