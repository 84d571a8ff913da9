#!/usr/bin/env bash
# `make demo`: the main job end to end on this machine. Grows with the project; every step that
# exists runs for real.
set -euo pipefail
moesim=${1:-build/moesim}
out=${2:-results/demo}
mkdir -p "$out"
"$moesim" --version
echo "demo: results in $out"
