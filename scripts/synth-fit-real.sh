#!/usr/bin/env bash
# The figures of traces/SYNTH.md, "A real log and routing less local than random": `moesim trace
# synth --fit` on
#   - the real Mixtral-8x7B routing log of tests/fixtures/mixtral-humaneval (vLLM, two HumanEval
#     problems, 338 decode tokens; provenance in that folder's README);
#   - a trace less local than random made here (tests/fixtures/anti-local: 64 experts, top-6,
#     8 MoE layers, 32 requests of 64 tokens = 2,048 tokens; reuse_top1_* = -0.9,
#     reuse_other_* = -0.5);
# each fitted trace 10 times longer than the real one, seed 2, compared with `--report`. Prints
# markdown: per trace the fit's simulations, the worst |synthetic - real| of the pooled LRU and
# OPT curves (capacities k..E), of gini, reuse any and reuse top-1, the rows within 0.02, and the
# worst gap of any one layer's LRU or OPT curve (all deterministic: `make docs` reproduces them;
# the fit's CPU seconds go to DIR/NAME-fit-cpu.txt, not into the table, as they vary by machine).
# Usage: scripts/synth-fit-real.sh [moesim] [dir]
set -euo pipefail
moesim=${1:-build/moesim}
out=${2:-results/synth-fit}
mkdir -p "$out"
anti="$out/anti-local.h5"
"$moesim" trace synth --model tests/fixtures/anti-local/model.ini --requests 32 --prompt-len 1 \
    --gen-len 63 --lookahead 0 --seed 1 \
    --set reuse_top1_first=-0.9 --set reuse_top1_mid=-0.9 --set reuse_top1_last=-0.9 \
    --set reuse_other_first=-0.5 --set reuse_other_mid=-0.5 --set reuse_other_last=-0.5 \
    -q -o "$anti"
# A trace's line: the fit alone (timed: user CPU seconds), then the report of seed 2 at 10x.
line() {
    local name=$1 file=$2 real=$3 requests=$4
    shift 4
    local cpu
    local TIMEFORMAT=%U # bash's time: the user CPU seconds of the fit alone
    cpu=$( { time "$moesim" trace synth --fit "$real" "$@" -q > /dev/null; } 2>&1 )
    echo "$cpu" > "$out/$file-fit-cpu.txt"
    "$moesim" trace synth --fit "$real" "$@" --requests "$requests" --seed 2 --report -q \
        > "$out/$file.txt"
    awk -v name="$name" '
        NR == 1 { s = $0; sub(/ simulations.*/, "", s); sub(/.*\(/, "", s); sims = s }
        { stat = substr($0, 1, 32); split(substr($0, 33), f, " "); gap = f[3] + 0; ok = f[4] == "ok" }
        stat ~ /^LRU hit rate, [0-9]+ experts/ { if (gap > lru) lru = gap; n++; k += ok }
        stat ~ /^OPT hit rate, [0-9]+ experts/ { if (gap > opt) opt = gap; n++; k += ok }
        stat ~ /^gini \(mean over layers\)/     { gini = gap; n++; k += ok }
        stat ~ /^reuse any/                     { any = gap; n++; k += ok }
        stat ~ /^reuse top-1/                   { top1 = gap }
        stat ~ /^(LRU|OPT) per layer: worst gap/ { if (f[2] > layer) layer = f[2] }
        END { printf "| %s | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %d / %d | %.3f |\n",
              name, sims, lru, opt, gini, any, top1, k, n, layer }' "$out/$file.txt"
}
echo "| real trace | simulations | LRU worst gap | OPT worst gap | gini gap | reuse-any gap | reuse-top-1 gap | rows within 0.02 | per-layer worst gap |"
echo "|---|---|---|---|---|---|---|---|---|"
line "Mixtral-8x7B HumanEval log (vLLM, 338 tokens)" mixtral-humaneval \
    tests/fixtures/mixtral-humaneval/mixtral-8x7b-humaneval-vllm.h5 20 --model mixtral-8x7b
line "anti-local, 64 experts top-6, 2,048 tokens" anti-local "$anti" 320 \
    --model tests/fixtures/anti-local/model.ini
