#!/usr/bin/env bash
# The noise floor of the per-layer match on the real Mixtral-8x7B log (traces/SYNTH.md, "Limits"):
# how far a log of its size is from the model it was drawn from, layer by layer. Takes the knobs
# fitted to tests/fixtures/mixtral-humaneval as the truth and draws N logs of its shape from them
# (2 requests of 169 decode tokens: its 338, seeds 1..N), then per draw:
#   - "draw vs model": the worst gap of any layer's LRU or OPT curve (capacities 2..8) between the
#     draw and the model's expectation (the same knobs, 200 requests, seed 1000);
#   - "refit": the draw fitted with `trace synth --fit` and compared as the real log is (a trace
#     10 times longer, seed 2): the worst per-layer LRU and OPT gaps of its `--report`.
# Prints markdown: one row per draw, then the real log's own row. Deterministic (`make docs`).
# Usage: scripts/synth-fit-floor.sh [moesim] [dir] [draws]
set -euo pipefail
moesim=${1:-build/moesim}
out=${2:-results/synth-fit}/floor
draws=${3:-8}
mkdir -p "$out"
real=tests/fixtures/mixtral-humaneval/mixtral-8x7b-humaneval-vllm.h5
shape=(--model mixtral-8x7b --prompt-len 1 --gen-len 169 --lookahead 0 -q)
"$moesim" trace synth --fit "$real" --model mixtral-8x7b --save-knobs "$out/knobs.ini" -q \
    > /dev/null
"$moesim" trace synth --knobs "$out/knobs.ini" "${shape[@]}" --requests 200 --seed 1000 \
    -o "$out/model.h5"
"$moesim" trace stats "$out/model.h5" --json > "$out/model.json"
# worst |a - b| over layers and capacities k..E of the LRU and OPT curves of two stats JSONs
worst_gap() {
    python3 - "$1" "$2" << 'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
gap = 0.0
for x, y in zip(a["per_layer"], b["per_layer"]):
    for kind in ("lru_hit_rate", "opt_hit_rate"):
        for c in range(a["top_k"], a["experts"] + 1):
            gap = max(gap, abs(x[kind][str(c)] - y[kind][str(c)]))
print("%.3f" % gap)
EOF
}
tokens_of() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["tokens"])' "$1"; }
# the worst per-layer LRU and OPT gaps of a --report
report_gaps() {
    awk '/^LRU per layer: worst gap/ { lru = $(NF - 1) }
         /^OPT per layer: worst gap/ { opt = $(NF - 1) }
         END { printf "%.3f | %.3f", lru, opt }' "$1"
}
printf '| log | tokens | draw vs model, per-layer worst gap | refit: LRU per-layer worst gap '
printf '| refit: OPT per-layer worst gap |\n'
echo "|---|---|---|---|---|"
for s in $(seq 1 "$draws"); do
    "$moesim" trace synth --knobs "$out/knobs.ini" "${shape[@]}" --requests 2 --seed "$s" \
        -o "$out/draw-$s.h5"
    "$moesim" trace stats "$out/draw-$s.h5" --json > "$out/draw-$s.json"
    tokens=$(tokens_of "$out/draw-$s.json")
    "$moesim" trace synth --fit "$out/draw-$s.h5" --model mixtral-8x7b --requests 20 --seed 2 \
        --report -q > "$out/refit-$s.txt"
    echo "| drawn from the fitted knobs, seed $s | $tokens | $(worst_gap "$out/draw-$s.json" \
        "$out/model.json") | $(report_gaps "$out/refit-$s.txt") |"
done
"$moesim" trace stats "$real" --json > "$out/real.json"
"$moesim" trace synth --fit "$real" --model mixtral-8x7b --requests 20 --seed 2 --report -q \
    > "$out/refit-real.txt"
echo "| the real log | $(tokens_of "$out/real.json") | $(worst_gap "$out/real.json" \
    "$out/model.json") | $(report_gaps "$out/refit-real.txt") |"
