#!/usr/bin/env bash
# Sweep throughput: 1,000 configurations (2 models x 5 policies x 25 per-layer cache sizes x 4
# batch sizes) over two synthesized 2,000-token traces (8 requests x 250 tokens), run by
# `moesim sweep -j 2` from an empty results file. Target: under 2 minutes on 2 cores.
# Prints configurations, wall time, rate, and the failure count (expected 0).
# Usage: bench/bench_sweep.sh [BUILD_DIR] [JOBS]
set -euo pipefail
build=${1:-build}
jobs=${2:-2}
moesim=$build/moesim
work=$(mktemp -d "${TMPDIR:-/tmp}/moesim-bench-sweep.XXXXXX")
trap 'rm -rf "$work"' EXIT

cat > "$work/bench.ini" <<INI
[experiment]
name = bench-sweep
paper = none: a throughput benchmark of the sweep runner
[fixed]
hw = rtx3090-pcie4
[axes]
policy = ondemand, lru, lfu, mixtral-offload, oracle
cache.experts_per_layer = 8:32:1
batch.size = 1, 2, 4, 8
[axis models]
qwen1.5 = model=qwen1.5-moe-a2.7b, trace=$work/qwen.h5
olmoe = model=olmoe-1b-7b, trace=$work/olmoe.h5
[traces]
$work/qwen.h5 = --model qwen1.5-moe-a2.7b --requests 8 --prompt-len 200 --gen-len 50 --seed 1
$work/olmoe.h5 = --model olmoe-1b-7b --requests 8 --prompt-len 200 --gen-len 50 --seed 1
INI

# the traces first, outside the timing (the [traces] recipes above say how they were made)
"$moesim" trace synth --model qwen1.5-moe-a2.7b --requests 8 --prompt-len 200 --gen-len 50 \
    --seed 1 -o "$work/qwen.h5"
"$moesim" trace synth --model olmoe-1b-7b --requests 8 --prompt-len 200 --gen-len 50 --seed 1 \
    -o "$work/olmoe.h5"

# wall and CPU seconds: on a shared machine the wall time includes waiting for the cores, the
# CPU time is what the sweep needs (CPU / jobs = its wall time on that many idle cores)
/usr/bin/time -f '%e %U %S' -o "$work/time.txt" \
    "$moesim" sweep "$work/bench.ini" -o "$work/bench.csv" -j "$jobs" -q > "$work/out.txt" \
    2> "$work/err.txt" || { cat "$work/err.txt" >&2; exit 1; }
rows=$(($(wc -l < "$work/bench.csv") - 1))
failed=$(awk -F, 'NR > 1 && $3 != "ok"' "$work/bench.csv" | wc -l)
read -r wall user sys < "$work/time.txt"
awk -v w="$wall" -v u="$user" -v s="$sys" -v n="$rows" -v f="$failed" -v j="$jobs" \
    -v load="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN {
    printf "bench_sweep: %d configurations over 2,000-token traces with -j %d: %.1f s wall " \
           "(%.1f configurations/s), %.1f s CPU (%.1f s per job: the wall time on %d idle cores); " \
           "%d failed; load average %s\n", n, j, w, n / w, u + s, (u + s) / j, j, f, load
}'
