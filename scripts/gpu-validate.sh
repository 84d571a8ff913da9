#!/usr/bin/env bash
# The simulator validated against the GPU replay, one stage per call of the lent GPU machine
# (each under its 10-minute limit):
#
#   scripts/gpu-validate.sh calibrate      build (scripts/gpu-deps.sh build), then moesim
#                                          calibrate: experiments/validation/$PROFILE.ini and
#                                          $PROFILE-cost.txt (PROFILE defaults to h100-measured)
#   scripts/gpu-validate.sh tests          build, ctest -L gpu (replay budget, copy order, copy
#                                          bandwidth vs calibration, lru hits = sim, a golden
#                                          checkpoint's weights; engine and kernel parity), then
#                                          `moesim replay --model` end to end on the golden
#                                          qwen2_moe: replay-model-golden.json
#   scripts/gpu-validate.sh validate B     build, the trace, then moesim validate over
#                                          experiments/validation/validate.ini at budget B GiB: validate-B.json
#   scripts/gpu-validate.sh report         here, no GPU: merge validate-*.json into
#                                          experiments/validation/report-<device>.md, validate.csv
#                                          and validate.svg (plots/validate.gp)
#
# Outputs go to experiments/validation/ and, when the device tool's $OUT is set, to
# $OUT/experiments/validation/ so they come back: copy them into the worktree before the next
# stage (the calibrated profile and cost table must be there for `validate`; untracked files
# travel with the working tree). README ("For developers") lists the whole sequence.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/experiments/validation"
profile="${PROFILE:-h100-measured}"
bin="$root/build-gpu/moesim"
export MOESIM_DATA_PATH="$root" # the configs beside this script, wherever the binary is

keep() { # copy outputs to $OUT so the device tool brings them back
    if [ -n "${OUT:-}" ]; then
        mkdir -p "$OUT/experiments/validation"
        cp "$@" "$OUT/experiments/validation/"
    fi
}

build() { # $@: the targets this stage needs
    TARGETS="$*" "$root/scripts/gpu-deps.sh" build >/dev/null
    eval "$("$root/scripts/gpu-deps.sh" env)"
}

make_trace() {
    mkdir -p "$root/results/validate"
    local t="$root/results/validate/qwen3-30b-a3b-validate.h5"
    [ -f "$t" ] || "$bin" trace synth --model qwen3-30b-a3b --requests 6 --prompt-len 32 \
        --gen-len 48 --seed 1 -q -o "$t"
}

case "${1:-}" in
calibrate)
    build moesim
    mkdir -p "$dir"
    "$bin" calibrate -o "$dir/$profile.ini" --table "$dir/$profile-cost.txt" --base h100-sxm \
        --model qwen3-30b-a3b --repeats "${REPEATS:-20}"
    keep "$dir/$profile.ini" "$dir/$profile-cost.txt"
    ;;
tests)
    build moesim test_gpu_replay test_gpu_engine test_gpu_kernels test_gpu_probe
    mkdir -p "$dir"
    rc=0
    ctest --test-dir "$root/build-gpu" -L gpu --output-on-failure --timeout 500 |
        tee "$dir/ctest-gpu.log" || rc=$?
    keep "$dir/ctest-gpu.log" # back even when a test failed: the log says which and why
    # the command with a checkpoint's weights: a trace the engine records from the golden
    # qwen2_moe, replayed with its own weights (4 of 8 experts per layer on the card)
    golden="$root/tests/fixtures/golden/qwen2_moe"
    mkdir -p "$root/results/validate"
    printf '1 17 42 99 3 250 7\n9 8 7 6 5\n' >"$root/results/validate/golden-prompts.txt"
    "$bin" record --model "$golden" --input "$root/results/validate/golden-prompts.txt" \
        -o "$root/results/validate/golden-qwen2_moe.h5" --gen-len 4 --threads 1 >/dev/null
    "$bin" replay --model "$golden" --trace "$root/results/validate/golden-qwen2_moe.h5" \
        --hw h100-sxm --policy lru --set memory.budget_gb=1 --set cache.experts_per_layer=4 \
        --json >"$dir/replay-model-golden.json" || rc=$?
    keep "$dir/replay-model-golden.json"
    exit "$rc"
    ;;
validate)
    budget="${2:?usage: scripts/gpu-validate.sh validate BUDGET_GB}"
    [ -f "$dir/$profile.ini" ] || { echo "gpu-validate: run the calibrate stage first ($dir/$profile.ini)" >&2; exit 2; }
    build moesim
    (cd "$root" && make_trace)
    rc=0
    (cd "$root" && "$bin" validate --experiment experiments/validation/validate.ini --budgets "$budget" \
        --json >"$dir/validate-$budget.json") || rc=$?
    if [ "$rc" -ne 0 ]; then rm -f "$dir/validate-$budget.json"; exit "$rc"; fi
    keep "$dir/validate-$budget.json"
    ;;
report)
    bin="${MOESIM:-$root/build/moesim}"
    shopt -s nullglob
    parts=("$dir"/validate-*.json)
    [ ${#parts[@]} -gt 0 ] || { echo "gpu-validate: no $dir/validate-*.json" >&2; exit 2; }
    args=()
    for p in "${parts[@]}"; do args+=(--merge "$p"); done
    device=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["device"])' "${parts[0]}" |
        tr 'A-Z ' 'a-z-')
    "$bin" validate "${args[@]}" --report "$dir/report-$device.md" --csv "$dir/validate.csv"
    gnuplot -e "csv='$dir/validate.csv'; set terminal svg size 720,600 dynamic; set output '$dir/validate.svg'" \
        "$root/plots/validate.gp"
    echo "gpu-validate: wrote $dir/report-$device.md, validate.csv, validate.svg"
    ;;
*)
    echo "usage: scripts/gpu-validate.sh calibrate|tests|validate BUDGET_GB|report" >&2
    exit 2
    ;;
esac
