#!/usr/bin/env python3
"""The include rules of docs/architecture.md, checked over `#include "..."` lines.

1. A folder of src/ includes only folders below it in LAYERS (or itself).
2. No file outside src/ and tests/ (include/, tools/, python/src/, bench/, examples/) includes a
   src/ header: they use the public API, include/tensorlift/*. (The build enforces it too: src/
   is an include directory only of the src/ targets and the tests.)
3. A folder's private headers (PRIVATE) are included only from that folder.

Prints every include that breaks a rule, grouped by rule and folder pair, and exits 1 if there is
any (0 otherwise). `--summary` prints only the counts. make test runs it (scripts/test.sh).
"""
import argparse
import collections
import os
import re
import sys

# Lowest first: a folder may include the ones before it.
LAYERS = ["common", "kernels", "io", "format", "device", "sparse", "load", "dist", "remote", "objstore", "sources", "capabilities"]
OUTSIDE = ["include", "tools", "python/src", "bench", "examples"]
# Headers their folder keeps to itself.
PRIVATE = ["load/loader_internal.h", "load/owners.h"]
INCLUDE = re.compile(r'\s*#\s*include\s+"([^"]+)"')
SOURCES = (".h", ".cc", ".cu", ".cuh", ".cpp")


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
    for path in files_under(root, "src"):
        here = path.split(os.sep)[1]
        for n, inc in includes(os.path.join(root, path)):
            there = inc.split("/")[0]
            if there in rank and here in rank and rank[there] > rank[here]:
                upward[(here, there)].append(f"{path}:{n} {inc}")
            if inc in PRIVATE and there != here:
                private[inc].append(f"{path}:{n} {inc}")
    for top in OUTSIDE:
        for path in files_under(root, top):
            for n, inc in includes(os.path.join(root, path)):
                if inc.split("/")[0] in rank:
                    outside[top].append(f"{path}:{n} {inc}")
    return upward, outside, private


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--summary", action="store_true")
    args = ap.parse_args()
    upward, outside, private = check(args.root)
    total = sum(map(len, upward.values())) + sum(map(len, outside.values())) + sum(map(len, private.values()))
    for (a, b), hits in sorted(upward.items()):
        print(f"upward: src/{a} includes src/{b} ({len(hits)})")
        if not args.summary:
            for h in hits:
                print(f"  {h}")
    for top, hits in sorted(outside.items()):
        print(f"outside src/: {top} includes src/ headers ({len(hits)})")
        if not args.summary:
            for h in hits:
                print(f"  {h}")
    for header, hits in sorted(private.items()):
        print(f"private: src/{header} included from another folder ({len(hits)})")
        if not args.summary:
            for h in hits:
                print(f"  {h}")
    print(f"{total} include(s) break the rules of docs/architecture.md")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
