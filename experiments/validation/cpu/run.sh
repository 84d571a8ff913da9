#!/usr/bin/env bash
# The CPU validation suite: for each experiment (one geometry each), makes its trace from the
# file's [traces] recipe, then runs every configuration through the simulator and the CPU replay
# in rounds, calibrating this machine for the geometry before the first round and after each
# (`moesim validate --calibrate-rounds`, as `moesim calibrate --backend cpu` does: each round is
# simulated with the machine as it was around it), and writes the report. Ends with a summary of
# every geometry.
#
#   experiments/validation/cpu/run.sh [MOESIM] [OUT_DIR] [EXPERIMENT ...] [-- VALIDATE ARGS]
# Defaults: build/moesim, results/validate-cpu, the four suite experiments beside this script.
# An experiment names its trace under results/validate-cpu/NAME/ (NAME:
# its [experiment] name); they are made in OUT_DIR/NAME/ (the experiment is read with those paths
# replaced, as OUT_DIR/NAME/experiment.ini), with report.md, report.csv, the calibrations between
# rounds (calibration/), validate.log and validate.status (its exit status). OUT_DIR/summary.md: one line per geometry. Exits 1 when
# a geometry's check ([validate] tpot_error_max, or --check) failed, after every geometry ran.
set -euo pipefail
moesim=${1:-build/moesim}
out=${2:-results/validate-cpu}
shift $(($# < 2 ? $# : 2))
here=experiments/validation/cpu
experiments=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
    experiments+=("$1")
    shift
done
[ "${1:-}" = -- ] && shift
[ ${#experiments[@]} -gt 0 ] ||
    experiments=("$here/validate-cpu.ini" "$here/validate-qwen1.5.ini" "$here/validate-qwen3.ini"
                 "$here/validate-mixtral.ini")

# The value of KEY in [SECTION] of an INI file (comments and spaces stripped).
ini_get() {
    awk -v sec="[$2]" -v key="$3" '
        /^\[/ { in_sec = ($1 == sec) ; next }
        in_sec { sub(/;.*/, ""); split($0, kv, "="); k = kv[1]; gsub(/ /, "", k)
                 if (k == key) { v = substr($0, index($0, "=") + 1); gsub(/^ +| +$/, "", v); print v; exit } }' "$1"
}

summary=$out/summary.md
failed=0
mkdir -p "$out"
{
    echo "# CPU validation suite: simulator vs replay, per geometry"
    echo
    echo "| geometry | experiment | median TPOT error, TTFT error, total error | order | drift (slices' noise) | TPOT error with one calibration before | targets |"
    echo "|---|---|---|---|---|---|---|"
} > "$summary.tmp"
for experiment in "${experiments[@]}"; do
    name=$(ini_get "$experiment" experiment name)
    [ -n "$name" ] || name=$(basename "$experiment" .ini)
    dir=$out/$name
    mkdir -p "$dir"
    sed "s|results/validate-cpu/|$out/|g" "$experiment" > "$dir/experiment.ini"
    model=$(ini_get "$dir/experiment.ini" fixed model)
    # the file's [traces] recipes: PATH = ARGS of `moesim trace synth`
    awk '/^\[/ { t = ($1 == "[traces]"); next }
         t && /=/ { sub(/;.*/, ""); p = substr($0, 1, index($0, "=") - 1); gsub(/ /, "", p)
                    print p "\t" substr($0, index($0, "=") + 1) }' "$dir/experiment.ini" |
        while IFS=$'\t' read -r path args; do
            # shellcheck disable=SC2086 # the recipe's arguments, split as the sweep splits them
            "$moesim" trace synth $args -q -o "$path"
        done
    status=0 # a failed check (exit 1) of one geometry does not stop the others
    "$moesim" validate --backend cpu --experiment "$dir/experiment.ini" \
        --calibrate-rounds "$dir/calibration" --report "$dir/report.md" --csv "$dir/report.csv" \
        "$@" 2> >(tee "$dir/validate.log" >&2) || status=$?
    wait # the tee
    echo "$status" > "$dir/validate.status"
    [ "$status" -le 1 ] || exit "$status"
    [ "$status" -eq 0 ] || failed=1
    # the report's figures for the summary line (sed -n: a line the report lacks gives "")
    medians=$(sed -n 's/^Median |TPOT error| \([0-9.]* %\).*median |TTFT error| \([0-9.]* %\).*median |total error| \([0-9.]* %\).*/\1, \2, \3/p' "$dir/report.md")
    order=$(sed -n 's/.*of the \([0-9]*\) pairs the replay orders (.*), \([0-9]*\) agree.*/\2 of \1 pairs the replay orders agree/p' "$dir/report.md")
    drift=$(sed -n 's/^Drift within the compared rounds.*own noise, median \([0-9.]* %\)).*: median \([0-9.]* %\) against.*/\2 (\1)/p' "$dir/report.md")
    first=$(sed -n 's/.*as with one calibration before the validation: \([0-9.]* %\)).*/\1/p' "$dir/report.md")
    targets=$(sed -n 's/.* Targets \([a-z ]*met\)\..*/\1/p' "$dir/report.md")
    grep -q 'no result is called' "$dir/report.md" && targets="no result: the machine drifted more than the error"
    echo "| $(basename "$model" .ini) | [$name]($name/report.md) | $medians | $order | $drift | $first | $targets |" >> "$summary.tmp"
done
mv "$summary.tmp" "$summary"
cat "$summary"
exit "$failed"
