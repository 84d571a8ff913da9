#!/usr/bin/env bash
# `make demo`: the main job end to end on this machine (`make` has built moesim). Every step runs
# for real:
#   1. quality of quantized experts: a real MoE forward pass (CPU engine) on the committed golden
#      checkpoints of the four architectures, KL divergence against bf16;
#   2. small versions of experiments 1-3 (DyMoE Table 3 ablation, DyMoE retention knob, FIRM-MoE
#      Fig. 4 cache sweep over every policy) with `moesim sweep` on all cores, their figures with
#      `moesim plot`, and a summary table: policy x setting -> TTFT, TPOT, hit rate, precision mix.
# Under a minute on 2 cores once built. Outputs in results/demo/ (a rerun reuses finished rows).
set -euo pipefail
moesim=${1:-build/moesim}
out=${2:-results/demo}
fixtures=tests/fixtures/golden
mkdir -p "$out"
"$moesim" --version
t_start=$(date +%s)

# Token ids below the fixtures' vocabulary (256): two short "prompts".
tokens="$out/tokens.txt"
printf '1 17 42 99 5 200 31 7 64 128 3 250\n1 8 16 24 32 40 48 56 72 80 88 96 104 112\n' > "$tokens"

echo
echo "== 1. expert precision vs quality (CPU engine, golden checkpoints, KL vs bf16 in nats/token)"
printf '%-10s %12s %12s %12s\n' model int8 int4 int2
for arch in mixtral olmoe qwen2_moe qwen3_moe; do
    row=$(printf '%-10s' "$arch")
    for p in int8 int4 int2; do
        kl=$("$moesim" eval --model "$fixtures/$arch" --input "$tokens" --precision "$p" --json |
             sed -n 's/.*"kl_mean_nats": *\([^,}]*\).*/\1/p' | head -n 1)
        row+=$(printf ' %12.3g' "$kl")
    done
    echo "$row"
done | tee "$out/quantization-kl.txt"

echo
echo "== 2. router traces and sweeps (small versions of experiments 1-3), their figures"
experiments=(dymoe-ablation retention-sweep cache-size-sweep)
for name in "${experiments[@]}"; do
    # results/demo/ stands in for results/: the experiment files make their traces there on first
    # use (their [traces] recipes: `moesim trace synth`, calibrated per model family)
    "$moesim" sweep "experiments/demo/$name.ini" -o "$out/$name.csv" -q
    "$moesim" plot "$name" --csv "$out/$name.csv" -o "$out" 2> "$out/$name.plot.log" >/dev/null ||
        { cat "$out/$name.plot.log" >&2; exit 1; }
done

# The summary: one line per configuration, the columns found by name in each CSV header. The
# label is the named columns plus every other setting column (those between "status" and
# "tokens") that differs between rows the named columns alone would label alike, so no two lines
# carry the same label (the file is read twice: first to find those columns).
summary() { # csv, label columns (comma-separated names)
    awk -F, -v want="$2" '
        FNR == 1 {
            n = split(want, w, ",")
            for (i = 1; i <= NF; i++) col[$i] = i
            if (NR == FNR) {
                in_settings = 0
                for (i = 1; i <= NF; i++) {
                    if ($i == "tokens") in_settings = 0
                    if (in_settings) setting[i] = 1
                    if ($i == "status") in_settings = 1
                }
                for (j = 1; j <= n; j++) if (w[j] in col) delete setting[col[w[j]]]
            }
            next
        }
        function base_label(   j, v, l) {
            l = ""
            for (j = 1; j <= n; j++) {
                v = (w[j] in col) ? $(col[w[j]]) : ""
                if (v != "") l = l (l == "" ? "" : " ") v
            }
            return l
        }
        NR == FNR {
            b = base_label()
            for (i in setting) {
                if ((i, b) in first && first[i, b] != $i) extra[i] = 1
                else first[i, b] = $i
            }
            next
        }
        {
            label = base_label()
            for (i = 1; i <= NF; i++) if (i in extra) label = label " " $i
            if ($(col["status"]) != "ok") {
                printf "%-44s %s\n", label, substr($(col["status"]), 1, 70)
                next
            }
            printf "%-44s %10.1f %10.2f %8.1f %6.0f/%3.0f/%3.0f\n", label, \
                $(col["ttft_ms.mean"]), $(col["tpot_ms.mean"]), 100 * $(col["hit_rate"]), \
                100 * $(col["precision_mix.hi"]), 100 * $(col["precision_mix.lo"]), \
                100 * $(col["precision_mix.skip"])
        }' "$1" "$1" | sort
}
{
    printf '\n%-44s %10s %10s %8s %14s\n' "policy x setting" "TTFT ms" "TPOT ms" "hit %" "hi/lo/skip %"
    echo "-- DyMoE Table 3 ablation (Mixtral-8x7B, RTX 3090 PCIe Gen3; row, budget GB)"
    summary "$out/dymoe-ablation.csv" "ablation,memory.budget_gb"
    echo "-- DyMoE retention knob (Mixtral-8x7B, RTX 3090 PCIe Gen3; strategy, budget GB, r)"
    summary "$out/retention-sweep.csv" "strategy,memory.budget_gb,dymoe.retention"
    echo "-- FIRM-MoE Fig. 4 cache sweep (RTX 3090 PCIe 4.0; policy, model, experts cached, variant)"
    summary "$out/cache-size-sweep.csv" "policy,model,label.cache_experts,variant"
} | tee "$out/summary.txt"

echo
echo "figures:"
for name in "${experiments[@]}"; do echo "  $out/$name.png  $out/$name.svg"; done
echo "demo: results in $out (summary.txt, *.csv, *.experiment.ini) in $(($(date +%s) - t_start)) s"
