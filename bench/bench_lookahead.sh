#!/usr/bin/env bash
# The simulator's throughput against `trace stats`, with and without look-ahead rows: one
# synthetic Qwen3-30B-A3B routing (REQUESTS requests of 32 prompt + 968 decode tokens, seed 1)
# written twice by `moesim trace synth`, with the default look-ahead rows and with --lookahead 0,
# then `moesim trace stats` and `moesim sim` for each policy on both, every run pinned to one
# core (taskset -c CORE), a6000, memory.budget_gb=24, for each batch size of BATCHES. Prints CPU
# seconds (user + sys of the whole process, so that other jobs on a shared machine do not count),
# M routed activations per CPU second, and the ratios in the same run: sim with / without
# look-ahead rows (the target for a policy that ignores them: >= 0.9), and sim / trace stats
# without and with them (targets: lru >= 1.0, every policy >= 0.5). `trace stats` runs again
# beside each row's runs (stats, without, with, REPEATS times): a virtual machine's speed drifts
# by tens of % over minutes, so a ratio compares runs made minutes apart at most.
# Usage: bench/bench_lookahead.sh [BUILD_DIR] [POLICIES (default: every registered one)]
# Environment: REQUESTS (default 100: 10^5 tokens), BATCHES (default "1 4"), CORE (default 0),
# REPEATS (default 1): each run that many times, alternating without / with, the least CPU time
# kept (other jobs on a shared core inflate CPU time too: caches, frequency).
set -euo pipefail
build=${1:-build}
moesim=$build/moesim
requests=${REQUESTS:-100}
batches=${BATCHES:-${BATCH:-1 4}}
core=${CORE:-0}
repeats=${REPEATS:-1}
policies=${2:-$("$moesim" sim --list-policies | awk '/^[a-z]/ {print $1}')}
work=$(mktemp -d "${TMPDIR:-/tmp}/moesim-bench-la.XXXXXX")
trap 'rm -rf "$work"' EXIT
synth=(trace synth --model qwen3-30b-a3b --requests "$requests" --prompt-len 32 --gen-len 968
    --seed 1 -q)
"$moesim" "${synth[@]}" -o "$work/la.h5"
"$moesim" "${synth[@]}" --lookahead 0 -o "$work/nola.h5"
# routed activations: tokens x MoE layers x top-k (Qwen3-30B-A3B: 48 x 8)
acts=$((requests * 1000 * 48 * 8))

# CPU seconds of one pinned command (its stdout discarded); "failed" when it fails
cpu_of() {
    if ! /usr/bin/time -f '%U %S' -o "$work/time" taskset -c "$core" "$@" > /dev/null \
        2> "$work/err"; then
        echo failed
        return
    fi
    awk '{printf "%.2f", $1 + $2}' "$work/time"
}
min() { awk -v a="$1" -v b="$2" 'BEGIN {print (a == "" || b + 0 < a + 0) ? b : a}'; }

echo "bench_lookahead: Qwen3-30B-A3B, $requests x (32 + 968) tokens = $acts activations," \
    "a6000, budget 24 GB, batches $batches, core $core, least CPU time of $repeats"
echo "stats s: trace stats (no look-ahead rows) beside the row's runs; CPU s and M act/s without /"
echo "with look-ahead rows; with/without: throughput ratio; sim/stats: throughput of sim without"
echo "(with) look-ahead rows / trace stats"
printf '%-5s %-16s %8s %9s %9s %11s %11s %12s %9s %9s\n' batch policy "stats s" "s without" \
    "s with" "M/s without" "M/s with" "with/without" "sim/stats" "(with)"
for batch in $batches; do
    for pol in $policies; do
        sim=(sim --hw a6000 --policy "$pol" --set memory.budget_gb=24 --set batch.size="$batch")
        st="" s0="" s1=""
        for ((i = 0; i < repeats; i++)); do
            st=$(min "$st" "$(cpu_of "$moesim" trace stats "$work/nola.h5")")
            x=$(cpu_of "$moesim" "${sim[@]}" --trace "$work/nola.h5")
            [[ $x == failed ]] && break
            s0=$(min "$s0" "$x")
            x=$(cpu_of "$moesim" "${sim[@]}" --trace "$work/la.h5")
            [[ $x == failed ]] && break
            s1=$(min "$s1" "$x")
        done
        if [[ $x == failed ]]; then
            printf '%-5s %-16s failed: %s\n' "$batch" "$pol" "$(head -c 100 "$work/err")"
            continue
        fi
        awk -v b="$batch" -v p="$pol" -v a=$acts -v s0="$s0" -v s1="$s1" -v st="$st" 'BEGIN {
            printf "%-5s %-16s %8.2f %9.2f %9.2f %11.2f %11.2f %12.2f %9.2f %9.2f\n", b, p, st,
                   s0, s1, a / s0 / 1e6, a / s1 / 1e6, s0 / s1, st / s0, st / s1
        }'
    done
done
