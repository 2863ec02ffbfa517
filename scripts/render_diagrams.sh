#!/usr/bin/env bash
# Renders docs/diagrams/*.dot to SVG beside them (graphviz's dot; scripts/setup.sh installs it
# for make test). Run after editing a diagram's source, and commit both.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
command -v dot >/dev/null || { echo "render_diagrams: graphviz's dot is missing (apt-get install graphviz)" >&2; exit 1; }
for src in "$root"/docs/diagrams/*.dot; do
  dot -Tsvg "$src" -o "${src%.dot}.svg"
  echo "render_diagrams: ${src#$root/} -> ${src%.dot}.svg"
done
