#!/usr/bin/env bash
# Byte-identity check for simulator changes that must not change a figure: runs every registered
# policy on a few synthesized traces and settings with two moesim binaries (the commit a change
# starts from, and the change) and compares the JSON of `moesim sim --json` byte for byte.
# Prints one line per case and a summary; exit status 1 when any output differs.
# Usage: bench/check_identical.sh OLD_MOESIM NEW_MOESIM
# A binary built in another checkout finds its configs in that checkout, and the JSON names the
# files it read: set MOESIM_DATA_PATH to one checkout so both read the same files.
# TRACES_BY=new: the traces are synthesized by NEW_MOESIM (default: by OLD_MOESIM), for a change
# to what the writer stores that a reader may use (both binaries then read the new files).
set -euo pipefail
old=${1:?usage: bench/check_identical.sh OLD_MOESIM NEW_MOESIM}
new=${2:?usage: bench/check_identical.sh OLD_MOESIM NEW_MOESIM}
case ${TRACES_BY:-old} in
old) synth=$old ;;
new) synth=$new ;;
*) echo "check_identical: TRACES_BY: expected old or new, got '$TRACES_BY'" >&2; exit 2 ;;
esac
work=$(mktemp -d "${TMPDIR:-/tmp}/moesim-identical.XXXXXX")
trap 'rm -rf "$work"' EXIT

# traces: recorded look-ahead, none (emulated predictor), and a three-model spread
"$synth" trace synth --model olmoe-1b-7b --requests 6 --prompt-len 16:64 --gen-len 24 --seed 3 \
    -q -o "$work/olmoe.h5"
"$synth" trace synth --model qwen1.5-moe-a2.7b --requests 4 --prompt-len 32 --gen-len 16:40 \
    --lookahead 0 --seed 5 -q -o "$work/qwen.h5"
"$synth" trace synth --model mixtral-8x7b --requests 3 --prompt-len 24 --gen-len 20 --seed 7 \
    -q -o "$work/mixtral.h5"

policies=$("$old" sim --list-policies | awk '/^[a-z]/ {print $1}' | sort -u)
settings=(
    ""
    "--set batch.size=4"
    "--set cache.experts_per_layer=8 --set batch.size=2" # at most Mixtral's 8 experts
    "--set expert.precision=int4 --set memory.budget_gb=6"
    "--set sim.part_overlap=false --set sim.chunk_kib=256 --set predictor.depth=2"
)
n=0 bad=0
for tr in olmoe qwen mixtral; do
    for pol in $policies; do
        for i in "${!settings[@]}"; do
            args=(sim --trace "$work/$tr.h5" --hw rtx3090-pcie4 --policy "$pol" --json)
            # shellcheck disable=SC2206
            extra=(${settings[$i]})
            set +e
            "$old" "${args[@]}" "${extra[@]}" > "$work/old.json" 2> "$work/old.err"
            rc_old=$?
            "$new" "${args[@]}" "${extra[@]}" > "$work/new.json" 2> "$work/new.err"
            rc_new=$?
            set -e
            n=$((n + 1))
            # the provenance's "git" names the build, not a figure: every commit differs there
            sed -i '/^ *"git": /d' "$work/old.json" "$work/new.json"
            if [[ $rc_old != "$rc_new" ]] || ! cmp -s "$work/old.json" "$work/new.json" ||
                ! cmp -s "$work/old.err" "$work/new.err"; then
                bad=$((bad + 1))
                echo "DIFFERS: $tr $pol ${settings[$i]} (exit $rc_old vs $rc_new)"
            fi
        done
    done
done
echo "check_identical: $n cases, $bad differ"
[[ $bad == 0 ]]
