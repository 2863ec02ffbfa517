#!/usr/bin/env bash
# Configures and builds one build directory: scripts/build.sh DIR [cmake args...]
# Leaves the CLI at DIR/tensorlift.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=$1; shift
cd "$root"
if [ ! -f "$dir/CMakeCache.txt" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" > "$dir.cmake.log" 2>&1 \
    || { cat "$dir.cmake.log"; exit 1; }
fi
cmake --build "$dir" -j "$(nproc)" 2>&1 | grep -vE '^\[ *[0-9]+%\]|^make|Consolidate compiler generated dependencies' || true
test "${PIPESTATUS[0]}" -eq 0
