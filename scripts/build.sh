#!/usr/bin/env bash
# Configures and builds one build directory: scripts/build.sh DIR [cmake args...]
# Leaves the CLI at DIR/tensorlift.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=$1; shift
cd "$root"
. "$root/scripts/ccache_env.sh"
if [ ! -f "$dir/CMakeCache.txt" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" > "$dir.cmake.log" 2>&1 \
    || { cat "$dir.cmake.log"; exit 1; }
fi
# Show warnings and errors, not progress lines; fail when the build fails.
set +e
# TL_BUILD_TARGETS (space-separated): build only those targets (and what they need).
cmake --build "$dir" -j "$(nproc)" ${TL_BUILD_TARGETS:+--target $TL_BUILD_TARGETS} > "$dir.build.log" 2>&1
rc=$?
set -e
grep -vE '^\[ *[0-9]+%\]|^g?make|Consolidate compiler generated dependencies' "$dir.build.log" || true
exit $rc
