#!/usr/bin/env bash
# The CPU validation of the simulator: synthesizes the trace, calibrates this machine
# (`moesim calibrate --backend cpu`), then runs every configuration of an experiment through the
# simulator and the CPU replay and writes the report.
#
#   experiments/validation/cpu/run.sh [MOESIM] [OUT_DIR] [EXPERIMENT] [GEN_LEN] [-- VALIDATE ARGS]
# Defaults: build/moesim, results/validate-cpu, experiments/validation/cpu/validate-cpu.ini, 64
# generated tokens per request. The experiment names its trace, profile and cost table under
# results/validate-cpu/; with another OUT_DIR they are made there and the experiment is read with
# those paths replaced. Writes OUT_DIR/report.md and report.csv.
set -euo pipefail
moesim=${1:-build/moesim}
out=${2:-results/validate-cpu}
experiment=${3:-experiments/validation/cpu/validate-cpu.ini}
gen=${4:-64}
shift $(( $# < 4 ? $# : 4 ))
[ "${1:-}" = -- ] && shift
geometry=experiments/validation/cpu/cpu-moe-small.ini
mkdir -p "$out"
if [ "$out" != results/validate-cpu ]; then # the experiment, pointing at OUT_DIR
    sed "s|results/validate-cpu/|$out/|g" "$experiment" > "$out/experiment.ini"
    experiment=$out/experiment.ini
fi
"$moesim" trace synth --model "$geometry" --requests 2 --prompt-len 16 --gen-len "$gen" \
    --lookahead 0 --seed 1 -q -o "$out/cpu-moe-small.h5"
"$moesim" calibrate --backend cpu --base cpu-host --model "$geometry" --repeats 20 \
    -o "$out/cpu-measured.ini" --table "$out/cpu-measured-cost.txt" >&2
"$moesim" validate --backend cpu --experiment "$experiment" --report "$out/report.md" \
    --csv "$out/report.csv" "$@"
