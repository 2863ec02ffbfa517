#!/usr/bin/env bash
# make demo, after scripts/setup.sh demo: builds what the demo runs (a Release build of
# the library, the CLI and the Python package in build-demo/, without the tests and
# benchmarks, which make build adds in build/), installs the package into .venv, and runs
# scripts/demo.py. A second run rebuilds only what changed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
. "$root/scripts/ccache_env.sh"
dir=build-demo
log=$root/$dir.build.log
mkdir -p "$dir"
rm -rf "$dir/dist"
t=$SECONDS
echo "demo: building the library, the CLI and the Python package (Release, $dir/; log: $log)"
if ! CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" .venv/bin/python -m pip wheel --no-build-isolation --no-deps \
      --disable-pip-version-check -q -w "$dir/dist" -Cbuild-dir="$dir" -Ccmake.build-type=Release \
      -Cinstall.strip=true . > "$log" 2>&1; then
  tail -n 60 "$log"
  echo "demo: the build failed (the whole output: $log)" >&2
  exit 1
fi
if ! .venv/bin/python -m pip install --no-deps --force-reinstall --disable-pip-version-check -q \
      "$dir"/dist/tensorlift-*.whl >> "$log" 2>&1; then
  tail -n 30 "$log"
  echo "demo: installing the package into .venv failed (the whole output: $log)" >&2
  exit 1
fi
echo "demo: built and installed in $((SECONDS - t)) s"
TENSORLIFT_BUILD=$root/$dir exec .venv/bin/python scripts/demo.py
