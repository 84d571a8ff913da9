#!/usr/bin/env bash
# Runs every libFuzzer harness of tests/fuzz for SECONDS each, one after the other, and prints
# one summary line per harness (the figures of tests/fuzz/README.md):
#   run.sh BUILD_DIR SECONDS [TARGET...]     (default: every build/fuzz/fuzz_* binary)
# With FUZZ_RUNS=N in the environment a harness also stops after N executions.
# Each harness grows its corpus in BUILD_DIR/fuzz-corpus/TARGET from the seeds of
# BUILD_DIR/fuzz-corpus/TARGET (make_seeds.sh); crashes, leaks, timeouts and out-of-memory inputs
# land in BUILD_DIR/fuzz-findings/ and make the script exit 1. Logs: BUILD_DIR/fuzz-logs/.
set -uo pipefail
build=${1:?usage: run.sh BUILD_DIR SECONDS [TARGET...]}
seconds=${2:?usage: run.sh BUILD_DIR SECONDS [TARGET...]}
shift 2
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for b in "$build"/fuzz/fuzz_*; do targets+=("$(basename "$b" | sed 's/^fuzz_//')"); done
fi

# Longest input per harness: a little above its largest seed (trace files are HDF5 images of
# ~36 KB; text inputs stay small so that each execution is quick).
max_len() {
    case $1 in
        trace) echo 40000 ;;
        safetensors) echo 65536 ;;
        import_jsonl | import_csv | import_npy | import_npz) echo 16384 ;;
        trace_h5) echo 512 ;; # edit programs: 16 edits at most
        *) echo 4096 ;;
    esac
}

# Seconds after which one input counts as a hang: 25, but an experiment may expand to
# SWEEP_MAX_CROSS (10^6) configurations by design, which the instrumented build loads, writes and
# loads back in about a minute.
hang_seconds() {
    case $1 in
        experiment) echo 180 ;;
        *) echo 25 ;;
    esac
}

mkdir -p "$build/fuzz-findings" "$build/fuzz-logs"
status=0
printf '%-14s %12s %9s %7s %6s %7s %8s %s\n' harness executions exec/s seconds cov ft corpus findings
for t in "${targets[@]}"; do
    bin=$build/fuzz/fuzz_$t
    corpus=$build/fuzz-corpus/$t
    log=$build/fuzz-logs/$t.log
    mkdir -p "$corpus"
    before=$(ls "$build/fuzz-findings" | grep -c "^$t-" || true)
    start=$(date +%s)
    # -rss_limit_mb: more than 2 GiB for one input is an out-of-memory finding
    "$bin" -max_total_time="$seconds" -max_len="$(max_len "$t")" -timeout="$(hang_seconds "$t")" \
        -rss_limit_mb=2048 \
        ${FUZZ_RUNS:+-runs=$FUZZ_RUNS} -print_final_stats=1 -artifact_prefix="$build/fuzz-findings/$t-" \
        "$corpus" "$build/fuzz-corpus/$t" > "$log" 2>&1
    rc=$?
    elapsed=$(($(date +%s) - start))
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    cov=$(echo "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
    ft=$(echo "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
    corp=$(echo "$last" | sed -n 's/.* corp: \([0-9]*\).*/\1/p')
    after=$(ls "$build/fuzz-findings" | grep -c "^$t-" || true)
    findings=$((after - before))
    printf '%-14s %12s %9s %7s %6s %7s %8s %s\n' "$t" "${runs:-?}" "${rate:-?}" "$elapsed" \
        "${cov:-?}" "${ft:-?}" "${corp:-?}" "$findings"
    if [ "$rc" -ne 0 ] || [ "$findings" -ne 0 ]; then
        echo "  fuzz_$t: exit $rc, see $log and $build/fuzz-findings/$t-*" >&2
        status=1
    fi
done
exit $status
