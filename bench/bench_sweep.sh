#!/usr/bin/env bash
# Sweep throughput: 1,000 configurations (2 models x 5 policies x 25 per-layer cache sizes x 4
# batch sizes) over two synthesized 2,000-token traces (8 requests x 250 tokens), run by
# `moesim sweep -j 2` from an empty results file. Target: under 2 minutes on 2 cores.
# Prints configurations, wall time, rate, and the failure count (expected 0). With OLD_MOESIM
# (the previous commit's binary), the same sweep by it right after, on the same traces, and the
# ratio of the two CPU times (old / new: > 1 when the new binary is faster).
# Usage: bench/bench_sweep.sh [BUILD_DIR] [JOBS] [OLD_MOESIM]
set -euo pipefail
build=${1:-build}
jobs=${2:-2}
old=${3:-}
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
# CPU time is what the sweep needs (CPU / jobs = its wall time on that many idle cores); prints
# one line and leaves the CPU seconds in $cpu
sweep_with() {
    local bin=$1
    rm -f "$work/bench.csv"
    /usr/bin/time -f '%e %U %S' -o "$work/time.txt" \
        "$bin" sweep "$work/bench.ini" -o "$work/bench.csv" -j "$jobs" -q > "$work/out.txt" \
        2> "$work/err.txt" || { cat "$work/err.txt" >&2; exit 1; }
    local rows failed wall user sys
    rows=$(($(wc -l < "$work/bench.csv") - 1))
    failed=$(awk -F, 'NR > 1 && $3 != "ok"' "$work/bench.csv" | wc -l)
    read -r wall user sys < "$work/time.txt"
    cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN {printf "%.2f", u + s}')
    awk -v b="$bin" -v w="$wall" -v c="$cpu" -v n="$rows" -v f="$failed" -v j="$jobs" \
        -v load="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN {
        printf "bench_sweep %s: %d configurations over 2,000-token traces with -j %d: %.1f s " \
               "wall (%.1f configurations/s), %.1f s CPU (%.1f s per job: the wall time on %d " \
               "idle cores); %d failed; load average %s\n", b, n, j, w, n / w, c, c / j, j, f, load
    }'
}
sweep_with "$moesim"
new_cpu=$cpu
if [[ -n $old ]]; then
    sweep_with "$old"
    awk -v o="$cpu" -v n="$new_cpu" 'BEGIN {printf "CPU time old / new: %.2f\n", o / n}'
fi
