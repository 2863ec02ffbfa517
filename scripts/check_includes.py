#!/usr/bin/env python3
"""The include rules of docs/architecture.md, checked over `#include "..."` lines and Python imports.

1. A folder of src/ includes only folders below it in LAYERS (or itself); every folder of src/
   is in LAYERS.
2. No file outside src/ and tests/ (include/, tools/, python/src/, bench/, examples/) includes a
   src/ header: they use the public API, include/tensorlift/*. (The build enforces it too: src/
   is an include directory only of the src/ targets and the tests.)
3. A folder's private headers (PRIVATE) are included only from that folder, and a header shared
   by a few folders (SHARED) only from those: the read engines (io/read_op.h) are run by the
   loader (load/), made by a checkpoint's store (format/store_reads.cc) and run on the local
   files by a striped load's disk source (sources/); every other folder reads bytes through a
   store or a load, or with the plain reads of io/pread.h.
4. No circles between files. C++: a unit is a file with the files of the same name in its folder
   (checkpoint.h and checkpoint.cc are one unit); unit A depends on unit B when a file of A
   includes a file of B (`#include "..."`, as the compiler finds it: beside the file, then under
   src/ and include/). Python: a unit is a module of python/tensorlift/; A depends on B when A
   imports B (relative or `tensorlift.` imports, those inside functions too). A circle is a set
   of units that depend on each other (a strongly connected component); each is printed as a
   path through its files, with the include or import of every step.

Prints everything that breaks a rule, grouped by rule and folder pair, and exits 1 if there is any
(0 otherwise). Circles listed in KNOWN_CIRCLES are printed as known and do not fail; an entry that
no circle matches any more fails, so that it is removed. `--summary` prints only the counts (and
the circles' paths). make test runs it (scripts/test.sh).
"""
import argparse
import ast
import collections
import os
import re
import sys

# Lowest first: a folder may include the ones before it.
LAYERS = ["common", "kernels", "io", "format", "device", "sparse", "load", "ranks", "remote", "objstore", "sources", "capabilities"]
OUTSIDE = ["include", "tools", "python/src", "bench", "examples"]
# Headers their folder keeps to itself.
PRIVATE = ["load/loader_internal.h", "load/owners.h", "load/sparse_load.h",
           "load/device_pipeline.h", "load/device_pipeline_steps.h", "load/pinned_pool.h",
           "load/device_ring.h", "load/device_load.h", "device/emulated_memory.h",
           "device/emulated_stream.h",
           "ranks/distributed_state.h", "objstore/s3_transfers.h", "sources/striped_plan.h",
           "sources/striped_sources.h", "sources/striped_store.h", "remote/ucx_core.h", "remote/peer_pull.h",
           "remote/peer_plan.h", "remote/peer_content.h",
           "remote/registry_entry.h"]
# Headers that only the folders listed may include (their own folder first).
SHARED = {"io/read_op.h": ["io", "format", "load", "capabilities", "sources"],
          # A relaying pull (sources/relay.cc): the host loader's hooks, a relay's server and
          # the pull's file.
          "load/host_load.h": ["load", "sources"],
          "remote/peer_server.h": ["remote", "sources"],
          "remote/peer_store.h": ["remote", "sources"]}
INCLUDE = re.compile(r'\s*#\s*include\s+"([^"]+)"')
SOURCES = (".h", ".cc", ".cu", ".cuh", ".cpp")
# The Python package whose imports are checked for circles, and its compiled module (no source).
PACKAGE = "python/tensorlift"
NATIVE = "_tensorlift"

# Circles present today, each as the set of its files (either file of a .h/.cc unit names it):
# reported as known, they do not fail (any other circle does). An entry that no circle matches
# fails: each is to be removed when fixed (issue 45).
KNOWN_CIRCLES = []


def includes(path):
    with open(path, errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m:
                yield n, m.group(1)


def files_under(root, top):
    for dirpath, _, names in os.walk(os.path.join(root, top)):
        for name in sorted(names):
            if name.endswith(SOURCES):
                yield os.path.relpath(os.path.join(dirpath, name), root)


def check(root):
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = collections.defaultdict(list)   # (from, to) -> [path:line include]
    outside = collections.defaultdict(list)  # top folder -> [path:line include]
    private = collections.defaultdict(list)  # header -> [path:line include]
    unlisted = [f for f in sorted(os.listdir(os.path.join(root, "src")))
                if os.path.isdir(os.path.join(root, "src", f)) and f not in rank]
    for path in files_under(root, "src"):
        here = path.split(os.sep)[1]
        for n, inc in includes(os.path.join(root, path)):
            there = inc.split("/")[0]
            if there in rank and here in rank and rank[there] > rank[here]:
                upward[(here, there)].append(f"{path}:{n} {inc}")
            if (inc in PRIVATE and there != here) or (inc in SHARED and here not in SHARED[inc]):
                private[inc].append(f"{path}:{n} {inc}")
    for top in OUTSIDE:
        for path in files_under(root, top):
            for n, inc in includes(os.path.join(root, path)):
                if inc.split("/")[0] in rank:
                    outside[top].append(f"{path}:{n} {inc}")
    return upward, outside, private, unlisted


def cxx_graph(root):
    """unit -> {unit it depends on: the first "path:line include" that makes it}, and unit -> files."""
    paths = [p for top in ["src"] + OUTSIDE for p in files_under(root, top)]
    known = set(paths)
    graph = collections.defaultdict(dict)
    files = collections.defaultdict(list)
    for path in paths:
        here = os.path.splitext(path)[0]
        files[here].append(path)
        for n, inc in includes(os.path.join(root, path)):
            for base in (os.path.dirname(path), "src", "include"):
                target = os.path.normpath(os.path.join(base, inc))
                if target in known:
                    there = os.path.splitext(target)[0]
                    if there != here:
                        graph[here].setdefault(there, f"{path}:{n} {inc}")
                    break
    return graph, files


def python_graph(root):
    """module path -> {module path it imports: the first "path:line import" that does}."""
    modules = {}  # dotted name -> path
    top = os.path.dirname(PACKAGE)
    for dirpath, _, names in os.walk(os.path.join(root, PACKAGE)):
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.relpath(os.path.join(dirpath, name), root)
                parts = os.path.relpath(path, top)[:-3].split(os.sep)
                modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = collections.defaultdict(dict)
    for name, path in modules.items():
        with open(os.path.join(root, path)) as f:
            text = f.read()
        lines = text.splitlines()
        package = name.split(".") if path.endswith("__init__.py") else name.split(".")[:-1]
        for node in ast.walk(ast.parse(text, path)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
                # `from X import y`: the module X.y when y is one, else X itself.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules or a.name == NATIVE else base
                           for a in node.names]
            else:
                continue
            for target in targets:
                if target in modules and modules[target] != path:
                    graph[path].setdefault(modules[target], f"{path}:{node.lineno} {lines[node.lineno - 1].strip()}")
    return graph


def circles(graph):
    """The strongly connected sets of more than one unit (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def path_through(graph, members):
    """A closed path through every member of a circle: from the first, each time to the nearest
    member not yet on it (breadth first, inside the circle), then back to the first."""
    inside = set(members)
    path, left = [members[0]], inside - {members[0]}
    while True:
        goals = left or {members[0]}
        before, queue = {path[-1]: None}, collections.deque([path[-1]])
        while queue:
            v = queue.popleft()
            if v in goals and v != path[-1]:
                break
            for w in sorted(graph.get(v, ())):
                if w in inside and w not in before:
                    before[w] = v
                    queue.append(w)
        step = []
        while v != path[-1]:
            step.append(v)
            v = before[v]
        path += reversed(step)
        left -= set(step)
        if not left and path[-1] == members[0]:
            return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--summary", action="store_true")
    args = ap.parse_args()
    upward, outside, private, unlisted = check(args.root)
    total = sum(map(len, upward.values())) + sum(map(len, outside.values())) + sum(map(len, private.values()))
    for folder in unlisted:
        print(f"no layer: src/{folder}/ is not in LAYERS (give it its place there)")
    for title, hits in sorted((f"upward: src/{a} includes src/{b}", h) for (a, b), h in upward.items()) + \
            sorted((f"outside src/: {top} includes src/ headers", h) for top, h in outside.items()) + \
            sorted((f"private: src/{header} included from "
                    + (f"a folder other than {', '.join(SHARED[header])}" if header in SHARED
                       else "another folder"), h) for header, h in private.items()):
        print(f"{title} ({len(hits)})")
        if not args.summary:
            for h in hits:
                print(f"  {h}")
    print(f"{total} include(s) break the rules of docs/architecture.md")

    cxx, files = cxx_graph(args.root)
    known = [{os.path.splitext(os.path.normpath(p))[0] for p in entry} for entry in KNOWN_CIRCLES]
    used, bad, allowed, stale = set(), 0, 0, 0

    def name(unit):  # checkpoint.{h,cc} for a unit of several files
        exts = sorted((os.path.splitext(p)[1] for p in files[unit]), key=SOURCES.index)
        return unit + exts[0] if len(exts) == 1 else f"{unit}.{{{','.join(e[1:] for e in exts)}}}"

    for graph, show in ((cxx, name), (python_graph(args.root), str)):
        for members in circles(graph):
            units = {os.path.splitext(m)[0] for m in members}
            entry = next((i for i, k in enumerate(known) if units <= k), None)
            path = path_through(graph, members)
            if entry is None:
                bad += 1
                print("circle: " + " → ".join(map(show, path)))
            else:
                used.add(entry)
                allowed += 1
                print("known circle (KNOWN_CIRCLES, issue 45): " + " → ".join(map(show, path)))
            if not args.summary:
                for a, b in zip(path, path[1:]):
                    print(f"  {graph[a][b]}")
    for i, entry in enumerate(KNOWN_CIRCLES):
        if i not in used:
            stale += 1
            print(f"stale: KNOWN_CIRCLES names {sorted(entry)}, which is no circle now: remove it")
    print(f"{bad} circle(s) between files, {allowed} known (KNOWN_CIRCLES: allowed until fixed)"
          + (f", {stale} stale KNOWN_CIRCLES entr{'y' if stale == 1 else 'ies'}" if stale else ""))
    return 1 if total or unlisted or bad or stale else 0


if __name__ == "__main__":
    sys.exit(main())
