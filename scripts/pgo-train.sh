#!/usr/bin/env bash
# The training run of a profile-guided build (`make pgo`; CMakeLists.txt, MOESIM_PGO): the work a
# sweep does, run by a profile-instrumented moesim, whose modules write their profile as it exits.
# Two synthetic traces per model (Qwen3-30B-A3B: 128 experts, top-8; Mixtral-8x7B: 8 experts,
# top-2), with look-ahead rows and without (the emulated predictor), each read by `trace stats`
# and simulated by every registered policy at batch 1 and 4 on an A6000 with 24 GB. The traces
# are small (5 requests): the profile needs the branches' odds, not long runs. About 35 s
# on 2 cores.
# Usage: scripts/pgo-train.sh MOESIM
set -euo pipefail
moesim=${1:?usage: scripts/pgo-train.sh MOESIM (built with MOESIM_PGO=GENERATE)}
work=$(mktemp -d "${TMPDIR:-/tmp}/moesim-pgo.XXXXXX")
trap 'rm -rf "$work"' EXIT
policies=$("$moesim" sim --list-policies | awk '/^[a-z]/ {print $1}')
for model in qwen3-30b-a3b mixtral-8x7b; do
    synth=(trace synth --model "$model" --requests 5 --prompt-len 32 --gen-len 968 --seed 1 -q)
    "$moesim" "${synth[@]}" -o "$work/$model-la.h5"
    "$moesim" "${synth[@]}" --lookahead 0 -o "$work/$model-nola.h5"
    for trace in "$work/$model-la.h5" "$work/$model-nola.h5"; do
        "$moesim" trace stats "$trace" > /dev/null
        for policy in $policies; do
            for batch in 1 4; do
                # a policy refused on this geometry (`static` when the experts do not fit) says
                # so with status 2 and trains nothing; any other failure ends the training
                "$moesim" sim --trace "$trace" --policy "$policy" --hw a6000 \
                    --set memory.budget_gb=24 --set batch.size="$batch" > /dev/null \
                    2> "$work/err" || { [[ $? == 2 ]] || { cat "$work/err" >&2; exit 1; }; }
            done
        done
    done
done
