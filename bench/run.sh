#!/usr/bin/env bash
# Runs every benchmark in bench/ and prints its figures.
set -euo pipefail
build=${1:-build}
for b in "$build"/bench/bench_*; do
    [ -x "$b" ] || continue
    echo "== $(basename "$b")"
    "$b"
done
# Benchmarks that drive the moesim binary are scripts.
for s in bench/bench_*.sh; do
    [ -f "$s" ] || continue
    echo "== $(basename "$s" .sh)"
    bash "$s" "$build"
done
