#!/usr/bin/env bash
# Simulator throughput and peak RSS on streamed Qwen3-30B-A3B traces of 10^4, 10^5 and 10^6
# tokens (requests of 32 prompt + 968 decode tokens, no look-ahead: the emulated predictor runs),
# synthesized with `moesim trace synth -o` (which streams) into a temporary folder and deleted
# after: bench_sim's figures for every seed policy, then, with OLD_MOESIM given, the same runs of
# `moesim sim` (whole process, reading included) with both binaries on the traces up to
# OLD_MAX_TOKENS (default 10^5; the old binary holds the whole trace) and their ratios.
# Usage: bench/bench_sim.sh [BUILD_DIR] [OLD_MOESIM] [SIZES (default "10000 100000 1000000")]
set -euo pipefail
build=${1:-build}
old=${2:-}
sizes=${3:-10000 100000 1000000}
old_max=${OLD_MAX_TOKENS:-100000}
moesim=$build/moesim
work=$(mktemp -d "${TMPDIR:-/tmp}/moesim-bench-sim.XXXXXX")
trap 'rm -rf "$work"' EXIT
traces=()
for n in $sizes; do
    "$moesim" trace synth --model qwen3-30b-a3b --requests $((n / 1000)) --prompt-len 32 \
        --gen-len 968 --lookahead 0 --seed 1 -q -o "$work/q$n.h5"
    traces+=("$work/q$n.h5")
done
"$build/bench/bench_sim" "${traces[@]}"
[[ -n $old ]] || exit 0
echo "moesim sim, new vs old (CPU s and peak MB of the whole process; ratio new / old):"
for n in $sizes; do
    ((n <= old_max)) || continue
    for pol in lru oracle dymoe firm-moe; do
        for which in old new; do
            bin=$moesim
            [[ $which == old ]] && bin=$old
            /usr/bin/time -f '%U %S %M' -o "$work/$which.time" "$bin" sim --trace "$work/q$n.h5" \
                --hw rtx3090-pcie4 --policy "$pol" --set batch.size=4 --json > "$work/$which.json"
        done
        same=identical
        cmp -s "$work/old.json" "$work/new.json" || same=DIFFERENT
        read -r ou os om < "$work/old.time"
        read -r nu ns nm < "$work/new.time"
        awk -v n="$n" -v p="$pol" -v ou="$ou" -v os="$os" -v om="$om" -v nu="$nu" -v ns="$ns" \
            -v nm="$nm" -v same="$same" 'BEGIN {
            printf "%8d %-10s CPU %6.2f -> %6.2f s (x%.2f)  peak %7.1f -> %6.1f MB (x%.2f)  JSON %s\n",
                   n, p, ou + os, nu + ns, (nu + ns) / (ou + os), om / 1024, nm / 1024, nm / om, same
        }'
    done
done
