#!/usr/bin/env bash
# The figures of traces/SYNTH.md, "Fitting to a trace": `moesim trace synth --fit` on the most
# real traces we can make here, each fitted trace 10x longer than the real one and of another
# seed (2; and, for the last column, 3 and 4), compared with `--report`:
#   - engine traces: `moesim record` on the four golden checkpoints (tests/fixtures/golden: 3 MoE
#     layers, 8 experts, top-2, random weights), 8 prompts of 16 tokens + 40 greedy decode tokens,
#     run one request at a time (batch 1) and in batches of 4 (decode interleaved);
#   - the stand-in for a serving log (we have no real vLLM log in the repo): 2 Mixtral-8x7B
#     requests of 24 + 169 tokens (338 decode tokens, as a real vLLM Mixtral-8x7B routing log of
#     two HumanEval problems), made by `trace synth` with stronger reuse than the published
#     defaults and locality reaching back several tokens (its gini, reuse and LRU curve near that
#     log's: SYNTH.md), exported as JSONL and read back with `trace import`.
# Prints markdown (traces/SYNTH.md's generated block, `make docs`): one row per trace (worst gaps;
# the fit's criterion is 0.02 everywhere), then the stand-in's criterion rows side by side;
# each trace's whole report stays in DIR/*.txt. Usage: scripts/synth-fit-figures.sh [moesim] [dir]
set -euo pipefail
moesim=${1:-build/moesim}
out=${2:-results/synth-fit}
mkdir -p "$out"
prompts="$out/prompts.txt"
cat > "$prompts" <<'EOF'
17 203 88 5 140 61 230 12 99 174 33 251 7 120 66 190
44 9 160 212 73 28 133 245 101 58 186 14 222 95 37 150
3 77 199 128 240 19 84 166 52 110 231 6 147 63 205 91
250 36 118 171 22 209 80 143 11 196 67 238 125 48 183 102
29 156 214 71 134 8 177 97 226 41 164 15 201 86 139 59
112 247 26 189 65 153 31 218 104 43 192 75 136 13 229 93
181 54 123 16 243 70 147 38 206 119 60 168 21 233 82 145
68 137 4 198 115 50 227 90 159 35 211 108 46 175 18 236
EOF
# A trace's line of the table: the worst |synthetic - real| per criterion, and how many of the
# criterion's rows are within 0.02; $2: the last column (the other seeds' worst gaps).
summarize() {
    # report rows: the statistic in 32 columns, then real, synthetic, |gap|, verdict, knob
    awk -v name="$1" -v seeds="$2" '
        { stat = substr($0, 1, 32); split(substr($0, 33), f, " "); gap = f[3] + 0; ok = f[4] == "ok" }
        stat ~ /^LRU hit rate, [0-9]+ experts/ { if (gap > lru) lru = gap; n++; k += ok }
        stat ~ /^OPT hit rate, [0-9]+ experts/ { if (gap > opt) opt = gap; n++; k += ok }
        stat ~ /^gini \(mean over layers\)/     { gini = gap; n++; k += ok }
        stat ~ /^reuse any/                     { reuse = gap; n++; k += ok }
        stat ~ /^active share, B = /            { if (gap > act) act = gap; n++; k += ok; has = 1 }
        stat ~ /^(LRU|OPT) per layer: worst gap/ { if (f[2] > layer) layer = f[2] }
        END { printf "| %s | %.3f | %.3f | %.3f | %.3f | %s | %d / %d | %.3f | %s |\n", name, lru,
              opt, gini, reuse, has ? sprintf("%.3f", act) : "-", k, n, layer, seeds }'
}
# The worst gap over the criterion's rows of one report.
worst_gap() {
    awk '{ stat = substr($0, 1, 32); split(substr($0, 33), f, " ") }
         stat ~ /^(LRU|OPT) hit rate, [0-9]+ experts|^gini \(mean|^reuse any|^active share, B = / {
             if (f[3] + 0 > w) w = f[3] + 0 }
         END { printf "%.3f", w }' "$1"
}
# Fits `real` (with the options after it) and reports against traces of seeds 2, 3 and 4; prints
# the table's line (seed 2's report in $out/NAME.txt, the others' worst gaps in the last column).
fit_and_summarize() {
    local name=$1 file=$2 real=$3
    shift 3
    local seeds=""
    for seed in 3 4; do
        "$moesim" trace synth --fit "$real" "$@" --seed "$seed" --report -q > "$out/$file-s$seed.txt"
        seeds="$seeds${seeds:+ / }$(worst_gap "$out/$file-s$seed.txt")"
    done
    "$moesim" trace synth --fit "$real" "$@" --seed 2 --report -q > "$out/$file.txt"
    summarize "$name" "$seeds" < "$out/$file.txt"
}
echo "| real trace | LRU worst gap | OPT worst gap | gini gap | reuse-any gap | active-share worst gap | rows within 0.02 | per-layer worst gap (informative) | worst gap, seeds 3 / 4 |"
echo "|---|---|---|---|---|---|---|---|---|"
for arch in mixtral olmoe qwen2_moe qwen3_moe; do
    for batch in 1 4; do
        real="$out/golden-$arch-b$batch.h5"
        "$moesim" record --model "tests/fixtures/golden/$arch" --input "$prompts" --gen-len 40 \
            --batch "$batch" --threads 1 --model-ini "$out/golden-$arch.ini" -o "$real" > /dev/null
        fit_and_summarize "golden $arch, batch $batch" "golden-$arch-b$batch" "$real" \
            --model "$out/golden-$arch.ini" --requests 80
    done
done
standin="$out/standin.h5"
"$moesim" trace synth --model mixtral-8x7b --requests 2 --prompt-len 24 --gen-len 169 \
    --lookahead 0 --seed 22 --set reuse_top1_first=0.1 --set reuse_top1_mid=0.2 \
    --set reuse_top1_last=0.15 --set reuse_other_first=0.15 --set reuse_other_mid=0.3 \
    --set reuse_other_last=0 --set reuse_history_first=0.2 --set reuse_history_mid=0.4 \
    --set reuse_history_last=0.3 --set reuse_history_tokens=6 -q -o "$standin"
"$moesim" trace export --format jsonl --quiet -o "$out/standin.jsonl" "$standin"
"$moesim" trace import --model mixtral-8x7b --quiet "$out/standin.jsonl" \
    -o "$out/standin-imported.h5" > /dev/null
fit_and_summarize "stand-in serving log (Mixtral-8x7B, imported)" standin \
    "$out/standin-imported.h5" --requests 20
echo
# the stand-in's report, abridged to the criterion's rows: LRU and OPT side by side
awk '
    NR == 1 { match($0, /[0-9]+ requests/); requests = substr($0, RSTART, RLENGTH) }
    /^report: / {
        sub(/^report: real \(/, ""); sub(/\) vs synthetic \(/, ", " requests ") vs the fitted trace (")
        printf "The stand-in'"'"'s criterion rows (the whole report: `%s/standin.txt`): real (%s.\n\n",
               dir, $0 }
    { stat = substr($0, 1, 32); sub(/ +$/, "", stat); split(substr($0, 33), f, " ") }
    stat ~ /^(gini \(mean over layers\)|reuse any|active share, B = [0-9]+)$/ && f[4] != "" {
        other[++n_other] = sprintf("%s | %.4f | %.4f", stat, f[1], f[2]) }
    stat ~ /^LRU hit rate, [0-9]+ experts/ { lru[++n_lru] = sprintf("%s | %.4f | %.4f", stat, f[1], f[2]) }
    stat ~ /^OPT hit rate, [0-9]+ experts/ { opt[++n_opt] = sprintf("%s | %.4f | %.4f", stat, f[1], f[2]) }
    END {
        print "| statistic | real | synthetic | statistic | real | synthetic |"
        print "|---|---|---|---|---|---|"
        for (i = 1; i <= n_lru; i++) printf "| %s | %s |\n", lru[i], opt[i]
        for (i = 1; i <= n_other; i += 2)
            printf "| %s | %s |\n", other[i], i + 1 <= n_other ? other[i + 1] : " | | "
    }' dir="$out" "$out/standin.txt"
