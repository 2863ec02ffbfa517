#!/usr/bin/env bash
# Builds the Python package from this checkout (scikit-build-core; build tree
# cached in build/python-<tag>) and installs it into the project's venv, so
# that `.venv/bin/python -c "import tensorlift"` works.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
log=build/pip-install.log
mkdir -p build
if ! CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" .venv/bin/python -m pip install --no-build-isolation --no-deps \
      --disable-pip-version-check -q . > "$log" 2>&1; then
  cat "$log"
  echo "install_python: pip install . failed" >&2
  exit 1
fi
