#!/usr/bin/env bash
# Peak RSS of the commands that read a whole trace, at two trace lengths: whether their memory
# stays flat as the trace grows (the target: within 10 % between 10^5 and 10^6 tokens).
# Synthesizes Qwen3-30B-A3B traces (requests of 32 prompt + 968 decode tokens, --lookahead 0,
# seed 1) of each size into a temporary folder, then runs, each under /usr/bin/time on core CORE:
#   trace stats FILE, trace validate FILE, sim --policy lru (a6000, budget 24 GB) and, with
#   FIT=1, trace synth --fit FILE (slow: its fitting runs for minutes per 10^5 tokens here).
# Prints one line per command: peak RSS (MB) and CPU s at each size, and the RSS ratio.
# `moesim replay` is not run: it executes every expert for real (minutes per thousand tokens on
# a CPU), so 10^5 tokens are out of reach on a machine without a GPU.
# Usage: bench/bench_memory.sh [BUILD_DIR] [SIZES (default "100000 1000000")]
# Environment: CORE (default 0), FIT (default 0).
set -euo pipefail
build=${1:-build}
sizes=${2:-100000 1000000}
core=${CORE:-0}
moesim=$build/moesim
work=$(mktemp -d "${TMPDIR:-/tmp}/moesim-bench-mem.XXXXXX")
trap 'rm -rf "$work"' EXIT
for n in $sizes; do
    "$moesim" trace synth --model qwen3-30b-a3b --requests $((n / 1000)) --prompt-len 32 \
        --gen-len 968 --lookahead 0 --seed 1 -q -o "$work/q$n.h5"
done

# "peak_MB cpu_s" of one command (stdout discarded)
measure() {
    /usr/bin/time -f '%M %U %S' -o "$work/time" taskset -c "$core" "$@" > /dev/null
    awk '{printf "%.1f %.2f", $1 / 1024, $2 + $3}' "$work/time"
}

echo "bench_memory: Qwen3-30B-A3B traces of $sizes tokens (no look-ahead rows), core $core"
printf '%-22s' command
for n in $sizes; do printf ' %14s' "MB @$n" "CPU s @$n"; done
printf ' %10s\n' "RSS ratio"
cmds=("trace stats" "trace validate" "sim lru")
[[ ${FIT:-0} == 1 ]] && cmds+=("trace synth --fit")
for c in "${cmds[@]}"; do
    printf '%-22s' "$c"
    first="" last=""
    for n in $sizes; do
        f=$work/q$n.h5
        case $c in
            "trace stats") r=$(measure "$moesim" trace stats "$f") ;;
            "trace validate") r=$(measure "$moesim" trace validate "$f") ;;
            "sim lru") r=$(measure "$moesim" sim --trace "$f" --hw a6000 --policy lru \
                --set memory.budget_gb=24) ;;
            "trace synth --fit") r=$(measure "$moesim" trace synth --fit "$f" -q) ;;
        esac
        read -r mb s <<< "$r"
        printf ' %14s %14s' "$mb" "$s"
        [[ -z $first ]] && first=$mb
        last=$mb
    done
    awk -v a="$first" -v b="$last" 'BEGIN {printf " %10.2f\n", b / a}'
done
