#!/usr/bin/env bash
# Peak RSS of the commands that read a trace, at two trace lengths: whether their memory stays
# flat as the trace grows (the target: within 10 % between 10^5 and 10^6 tokens).
# Synthesizes traces of each size (requests of 32 prompt + 968 decode tokens, --lookahead 0,
# seed 1) into a temporary folder: Qwen3-30B-A3B for trace stats, trace validate, sim and the
# fit's reading; the CPU validation's geometry (experiments/validation/cpu/cpu-moe-small.ini) for
# replay and validate. Each command runs under /usr/bin/time on core CORE:
#   trace stats FILE                      the whole command
#   trace validate FILE                   the whole command
#   sim --policy lru (a6000, 24 GB)       the whole command (SIM=1 only: minutes at 10^6 tokens)
#   replay --backend cpu (loading)        exits 2 at its budget check (memory.budget_gb=0.001),
#                                         after reading the trace and building its schedule and
#                                         request index, before any weights: a replay executes
#                                         every expert for real, 10^6 tokens are out of reach
#   validate --backend cpu (loading)      exits 2 after reading the trace, hardware profile and
#                                         model, before the expert file and the runs
#                                         (sim.host_precisions=policy, refused by the CPU backend)
#   trace synth --fit (reading)           exits 2 right after opening the real trace as a stream
#                                         (every block read and checked), at the fit's geometry
#                                         check (a --model of another geometry); FIT=1 runs the
#                                         whole fit instead (slow: tens of minutes per 10^5
#                                         Qwen3-30B-A3B tokens, and its simulations grow with
#                                         the trace: traces/SYNTH.md, "Memory")
# A command meant to stop early must exit 2 with the message expected, else the script fails.
# Prints one line per command: peak RSS (MB) and CPU s at each size, and the RSS ratio.
# Usage: bench/bench_memory.sh [BUILD_DIR] [SIZES (default "100000 1000000")]
# Environment: CORE (default 0), SIM (default 0), FIT (default 0).
set -euo pipefail
build=${1:-build}
sizes=${2:-100000 1000000}
core=${CORE:-0}
moesim=$build/moesim
src=$(cd "$(dirname "$0")/.." && pwd)
small=$src/experiments/validation/cpu/cpu-moe-small.ini
work=$(mktemp -d "${TMPDIR:-/tmp}/moesim-bench-mem.XXXXXX")
trap 'rm -rf "$work"' EXIT
for n in $sizes; do
    "$moesim" trace synth --model qwen3-30b-a3b --requests $((n / 1000)) --prompt-len 32 \
        --gen-len 968 --lookahead 0 --seed 1 -q -o "$work/q$n.h5"
    "$moesim" trace synth --model "$small" --requests $((n / 1000)) --prompt-len 32 \
        --gen-len 968 --lookahead 0 --seed 1 -q -o "$work/c$n.h5"
    # validate's configuration: the tiny trace and geometry, one policy
    printf '[experiment]\nname = bench-memory\n[fixed]\ntrace = %s\nmodel = %s\nhw = cpu-host\n%s\n' \
        "$work/c$n.h5" "$small" 'sim.host_precisions = policy' > "$work/validate$n.ini"
    printf '[axes]\npolicy = lru\n' >> "$work/validate$n.ini"
done

# "peak_MB cpu_s" of one command (stdout discarded). With EXPECT set, the command must exit 2
# and its stderr hold EXPECT (it stops where the comment above says); else it must succeed.
measure() {
    local rc=0
    /usr/bin/time -f '%M %U %S' -o "$work/time" taskset -c "$core" "$@" > /dev/null \
        2> "$work/err" || rc=$?
    if [[ -n ${EXPECT:-} ]]; then
        if [[ $rc != 2 ]] || ! grep -q -- "$EXPECT" "$work/err"; then
            echo "bench_memory: $* exited $rc, expected 2 with '$EXPECT':" >&2
            cat "$work/err" >&2
            exit 1
        fi
    elif [[ $rc != 0 ]]; then
        echo "bench_memory: $* failed:" >&2
        cat "$work/err" >&2
        exit 1
    fi
    # the last line: time writes "Command exited with non-zero status" before it
    tail -n 1 "$work/time" | awk '{printf "%.1f %.2f", $1 / 1024, $2 + $3}'
}

echo "bench_memory: traces of $sizes tokens (no look-ahead rows), core $core"
printf '%-30s' command
for n in $sizes; do printf ' %14s' "MB @$n" "CPU s @$n"; done
printf ' %10s\n' "RSS ratio"
cmds=("trace stats" "trace validate")
[[ ${SIM:-0} == 1 ]] && cmds+=("sim lru")
cmds+=("replay --backend cpu (load)" "validate --backend cpu (load)")
if [[ ${FIT:-0} == 1 ]]; then cmds+=("trace synth --fit"); else cmds+=("trace synth --fit (read)"); fi
for c in "${cmds[@]}"; do
    printf '%-30s' "$c"
    first="" last=""
    for n in $sizes; do
        q=$work/q$n.h5 tiny=$work/c$n.h5
        case $c in
            "trace stats") r=$(measure "$moesim" trace stats "$q") ;;
            "trace validate") r=$(measure "$moesim" trace validate "$q") ;;
            "sim lru") r=$(measure "$moesim" sim --trace "$q" --hw a6000 --policy lru \
                --set memory.budget_gb=24) ;;
            "replay --backend cpu (load)") r=$(EXPECT="leaves nothing for experts" measure \
                "$moesim" replay --backend cpu --synthetic-weights --trace "$tiny" --hw cpu-host \
                --model-geometry "$small" --policy lru --set memory.budget_gb=0.001 -q) ;;
            "validate --backend cpu (load)") r=$(EXPECT="host_precisions must list" measure \
                "$moesim" validate --backend cpu --experiment "$work/validate$n.ini" -q) ;;
            "trace synth --fit (read)") r=$(EXPECT="--model names the trace's model" measure \
                "$moesim" trace synth --fit "$q" --model mixtral-8x7b -q -o "$work/fit.h5") ;;
            "trace synth --fit") r=$(measure "$moesim" trace synth --fit "$q" -q \
                -o "$work/fit.h5") ;;
        esac
        read -r mb cpu_s <<< "$r"
        printf ' %14s %14s' "$mb" "$cpu_s"
        [[ -z $first ]] && first=$mb
        last=$mb
    done
    awk -v a="$first" -v b="$last" 'BEGIN {printf " %10.2f\n", b / a}'
done
