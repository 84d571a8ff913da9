#!/usr/bin/env bash
# The CUDA half on a lent GPU in one call of the device tool (its machine has nvcc, CMake and
# Python but none of our Debian libraries and no package registry; a call is at most 10 minutes
# and a lease 15, start included). Every result is written the moment it exists, so a call cut
# off at its limit still returns what ran.
#
#   scripts/gpu-first-run.sh prebuild   here: gather the .deb files (scripts/gpu-deps.sh gather),
#                                       build what the run needs for sm_90 in build-gpu and pack
#                                       it with the .deb files into .gpu-run/ (ignored; carry it)
#   scripts/gpu-first-run.sh engine     there: bench_gpu_engine (GEMV
#                                       GB/s per precision vs HBM, pinned H2D vs the best rate
#                                       it measures, decode tokens/s), and `moesim record
#                                       --backend cuda` on every golden checkpoint against the
#                                       CPU engine's trace of the same prompts
#   scripts/gpu-first-run.sh validate   there: the trace of experiments/validation/gpu/validate.ini,
#                                       `moesim calibrate` (profile + cost table), then `moesim
#                                       validate` over every policy, one budget per call
#   scripts/gpu-first-run.sh all        there: engine, then validate
#                                       (each stage then runs `ctest -L gpu`: kernel, engine,
#                                       probe and replay tests, the replay's needing minutes)
#   scripts/gpu-first-run.sh record BIN_DIR
#                                       the golden checkpoints recorded by BIN_DIR/moesim on
#                                       both engines, traces compared (engine runs it)
#   scripts/gpu-first-run.sh report DIR here: what came back (DIR: the device tool's files) into
#                                       experiments/validation/gpu/: logs, profile, cost table,
#                                       JSON per budget, the merged report, CSV and SVG
#
# There, the packed build runs as it is (same nvcc 13.0, glibc newer than this machine's; its
# paths are this checkout's, /work/main, linked to wherever the copy lands); when it does not
# start, the script builds build-gpu there instead (scripts/gpu-deps.sh build, a minute on 16
# cores). Results go to $OUT (the device tool's folder) or results/gpu-first-run: run.log (every
# step, its time and status), ctest-gpu.log, bench-gpu-engine.log, record-cuda.log,
# calibrate.tar and validate.tar (rewritten after each budget). GPU_DEADLINE_S (default 480)
# bounds the whole run: a step that cannot finish before it is skipped and said so.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
pack="$root/.gpu-run"
here_path=/work/main # where the packed build was configured (its RPATH, CTest files, fixtures)
experiment=experiments/validation/gpu/validate.ini
gpu_targets="moesim test_gpu_engine test_gpu_kernels test_gpu_probe test_gpu_replay test_cublas_lazy bench_gpu_engine"
start_s=$(date +%s)
deadline_s=${GPU_DEADLINE_S:-480}

out=${OUT:-$root/results/gpu-first-run}
mkdir -p "$out"
log="$out/run.log"

exec 3>&1 # the terminal (the device tool's output tail), whatever a step's output goes to
say() { echo "[$(($(date +%s) - start_s)) s] $*" | tee -a "$log" >&3; }
left() { echo $((deadline_s - ($(date +%s) - start_s))); }

# step NAME SECONDS COMMAND...: runs COMMAND under a timeout of at most SECONDS (less when the
# deadline is nearer), logs its status and time; skipped when under 20 s remain.
step() {
    local name=$1 limit=$2
    shift 2
    local l
    l=$(left)
    if [ "$l" -lt 20 ]; then
        say "SKIP $name: $l s left of the run's $deadline_s"
        return 1
    fi
    [ "$limit" -gt "$l" ] && limit=$l
    say "BEGIN $name (limit $limit s)"
    local t0=$(date +%s) rc=0
    timeout --kill-after=10 "$limit" "$@" || rc=$?
    say "END $name: exit $rc after $(($(date +%s) - t0)) s$([ $rc = 124 ] && echo ' (timed out)')"
    return $rc
}

prebuild() {
    [ "$root" = "$here_path" ] || { echo "gpu-first-run: prebuild from $here_path (the path the packed build keeps)" >&2; exit 2; }
    [ -d "$root/.deps/debs" ] || "$root/scripts/gpu-deps.sh" gather
    cmake -S "$root" -B "$root/build-gpu" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESIM_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null || exit 1
    # shellcheck disable=SC2086
    cmake --build "$root/build-gpu" -j "$(nproc)" --target $gpu_targets || exit 1
    rm -rf "$pack"
    mkdir -p "$pack/build-gpu"
    (cd "$root/build-gpu" && find . -name CTestTestfile.cmake -o -name 'libmoesim.so*' |
        xargs cp -P --parents -t "$pack/build-gpu")
    for t in $gpu_targets; do
        f=$(cd "$root/build-gpu" && find . -name "$t" -type f -perm -u+x | head -1)
        [ -n "$f" ] || { echo "gpu-first-run: no $t in build-gpu" >&2; exit 1; }
        mkdir -p "$pack/build-gpu/$(dirname "$f")"
        objcopy --strip-debug "$root/build-gpu/$f" "$pack/build-gpu/$f"
    done
    cp -r "$root/.deps/debs" "$pack/debs"
    echo "gpu-first-run: packed $(du -sm "$pack" | cut -f1) MiB in $pack (carry .gpu-run)"
}

# The build to run: the packed one when it starts here, else build-gpu built on this machine.
bin_dir=""
setup() {
    say "machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>&1 | head -1); $(nproc) cores; $(ldd --version 2>&1 | head -1)"
    nvidia-smi >>"$log" 2>&1
    # the .deb files: packed ones when carried, else scripts/gpu-deps.sh gather's
    if [ -d "$pack/debs" ] && [ ! -d "$root/.deps/debs" ]; then
        mkdir -p "$root/.deps" && cp -r "$pack/debs" "$root/.deps/debs"
    fi
    step unpack 120 "$root/scripts/gpu-deps.sh" unpack >>"$log" 2>&1 || return 1
    eval "$("$root/scripts/gpu-deps.sh" env)"
    if [ -d "$pack/build-gpu" ]; then
        if [ "$root" != "$here_path" ] && [ ! -e "$here_path" ]; then
            mkdir -p "$(dirname "$here_path")" && ln -s "$root" "$here_path"
        fi
        [ -e "$root/build-gpu" ] || ln -s "$pack/build-gpu" "$root/build-gpu"
        if [ "$(cd "$here_path" 2>/dev/null && pwd -P)" = "$(cd "$root" && pwd -P)" ] &&
            "$here_path/build-gpu/moesim" --version >>"$log" 2>&1; then
            bin_dir="$here_path/build-gpu"
            say "the packed build starts: $bin_dir"
            return 0
        fi
        say "the packed build does not start (run.log says why): building here"
        [ -L "$root/build-gpu" ] && rm "$root/build-gpu"
    fi
    step build 300 env TARGETS="$gpu_targets" "$root/scripts/gpu-deps.sh" build >>"$log" 2>&1 || return 1
    bin_dir="$root/build-gpu"
}

# One golden checkpoint recorded by both engines at bf16: routing identical, gates within
# 5e-6 (tests/test_gpu_engine.c GPU_GATE_ATOL: expf within 2 ulp, sums reordered).
record_pair() {
    local arch=$1 dir="$root/tests/fixtures/golden/$1" tmp=$2
    local m="$3/moesim"
    "$m" record --model "$dir" --input "$tmp/prompts.txt" -o "$tmp/$arch-cpu.h5" --gen-len 8 \
        --threads 4 >/dev/null || return 1
    "$m" record --model "$dir" --input "$tmp/prompts.txt" -o "$tmp/$arch-cuda.h5" --gen-len 8 \
        --backend cuda || return 1
    "$m" trace export --format csv --quiet "$tmp/$arch-cpu.h5" -o "$tmp/$arch-cpu.csv" || return 1
    "$m" trace export --format csv --quiet "$tmp/$arch-cuda.h5" -o "$tmp/$arch-cuda.csv" || return 1
    paste -d'\n' "$tmp/$arch-cpu.csv" "$tmp/$arch-cuda.csv" | awk -F, -v arch="$arch" '
        NR == 1 { for (i = 1; i <= NF; i++) if ($i ~ /^gate_/) { g0 = i; break } }
        NR % 2 == 1 { split($0, c, ","); next }
        { rows++
          for (i = 1; i < g0; i++) if ($i != c[i]) { diff++; break }
          for (i = g0; i <= NF; i++) { d = $i - c[i]; d = d < 0 ? -d : d; if (d > max) max = d } }
        END { printf "%s: %d rows, %d with other experts or tokens, max |gate difference| %.2e: %s\n",
                     arch, rows - 1, diff, max, diff == 0 && max <= 5e-6 ? "same routing" : "DIFFERENT"
              exit !(diff == 0 && max <= 5e-6) }'
}

record_all() {
    local bin=${1:?usage: scripts/gpu-first-run.sh record BIN_DIR} tmp rc=0
    tmp=$(mktemp -d)
    printf '1 17 42 99 3 250 7\n9 8 7 6 5\n31 4 15 92 65 35 89 79 32 38 46\n' >"$tmp/prompts.txt"
    for d in "$root"/tests/fixtures/golden/*/; do
        record_pair "$(basename "$d")" "$tmp" "$bin" || rc=1
    done
    rm -rf "$tmp"
    return $rc
}

ctest_gpu() {
    step ctest-gpu 400 ctest --test-dir "$bin_dir" -L gpu --output-on-failure --timeout 380 \
        >"$out/ctest-gpu.log" 2>&1
    tail -15 "$out/ctest-gpu.log" | tee -a "$log"
}

engine() {
    step record-cuda 60 "$root/scripts/gpu-first-run.sh" record "$bin_dir" >"$out/record-cuda.log" 2>&1
    tee -a "$log" <"$out/record-cuda.log"
    step bench-gpu-engine 150 "$bin_dir/bench/bench_gpu_engine" --layers 2 --gen 32 \
        >"$out/bench-gpu-engine.log" 2>&1
    tee -a "$log" <"$out/bench-gpu-engine.log"
}

# PATH<TAB>ARGS of the experiment's [traces] recipes (as `moesim sweep` reads them)
trace_recipes() {
    awk '/^\[/ { t = ($1 == "[traces]"); next }
         t && /=/ { sub(/;.*/, ""); p = substr($0, 1, index($0, "=") - 1); gsub(/ /, "", p)
                    print p "\t" substr($0, index($0, "=") + 1) }' "$root/$experiment"
}

validate() {
    local m="$bin_dir/moesim" vdir="$root/experiments/validation/gpu" work="$root/results/validate-gpu"
    mkdir -p "$work"
    cd "$root" || return 1
    trace_recipes | while IFS=$'\t' read -r path args; do
        # shellcheck disable=SC2086 # the recipe's arguments, split as the sweep splits them
        step trace 60 "$m" trace synth $args -q -o "$path" >>"$log" 2>&1 </dev/null
    done
    step calibrate 120 "$m" calibrate -o "$vdir/gpu-measured.ini" \
        --table "$vdir/gpu-measured-cost.txt" --base h100-sxm \
        --model experiments/validation/cpu/qwen3-30b-a3b-4l.ini --repeats 20 \
        >"$work/calibrate.log" 2>&1
    tee -a "$log" <"$work/calibrate.log"
    tar -cf "$out/calibrate.tar" -C "$root" experiments/validation/gpu/gpu-measured.ini \
        experiments/validation/gpu/gpu-measured-cost.txt -C "$work" calibrate.log 2>>"$log" ||
        return 1
    local budgets
    budgets=$(awk -F= '/^memory.budget_gb/ { sub(/;.*/, "", $2); gsub(/[ ,]+/, " ", $2); print $2 }' "$experiment")
    for b in $budgets; do
        step "validate $b GiB" 150 "$m" validate --experiment "$experiment" --budgets "$b" \
            --json >"$work/validate-$b.json" 2>"$work/validate-$b.log"
        tail -3 "$work/validate-$b.log" | tee -a "$log"
        (cd "$work" && tar -cf "$out/validate.tar.tmp" validate-*.json validate-*.log &&
            mv "$out/validate.tar.tmp" "$out/validate.tar")
    done
}

# Here: the device tool's files into experiments/validation/gpu/ and the merged report.
report() {
    local from=${1:?usage: scripts/gpu-first-run.sh report DIR}
    local vdir="$root/experiments/validation/gpu" bin="${MOESIM:-$root/build/moesim}"
    for f in run.log ctest-gpu.log bench-gpu-engine.log record-cuda.log; do
        [ -f "$from/$f" ] && cp "$from/$f" "$vdir/"
    done
    [ -f "$from/calibrate.tar" ] && tar -xf "$from/calibrate.tar" -C "$root" \
        experiments/validation/gpu && tar -xf "$from/calibrate.tar" -C "$vdir" calibrate.log
    [ -f "$from/validate.tar" ] && tar -xf "$from/validate.tar" -C "$vdir" --wildcards 'validate-*.json'
    shopt -s nullglob
    local parts=() args=()
    for p in "$vdir"/validate-*.json; do [ -s "$p" ] && parts+=("$p"); done
    [ ${#parts[@]} -gt 0 ] || { echo "gpu-first-run: no validate-*.json came back" >&2; exit 2; }
    for p in "${parts[@]}"; do args+=(--merge "$p"); done
    local device
    device=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["device"])' "${parts[0]}" |
        tr 'A-Z ' 'a-z-')
    "$bin" validate "${args[@]}" --report "$vdir/report-$device.md" --csv "$vdir/validate.csv"
    gnuplot -e "csv='$vdir/validate.csv'; set terminal svg size 720,600 dynamic; set output '$vdir/validate.svg'" \
        "$root/plots/validate.gp"
    echo "gpu-first-run: wrote $vdir/report-$device.md, validate.csv, validate.svg"
}

there() {
    setup || { say "no build to run: see run.log"; exit 1; }
    case $1 in # the stage's own results first, the tests last: a run cut short returns them
    engine) engine; ctest_gpu ;;
    validate) validate; ctest_gpu ;;
    all) engine; validate; ctest_gpu ;;
    esac
    say "done; $(left) s of the run's $deadline_s left"
    grep -E '^\[[0-9]+ s\] (END|SKIP)' "$log"
}

case "${1:-}" in
prebuild) prebuild ;;
engine | validate | all) there "$1" ;;
record) record_all "${2:-}" ;;
report) report "${2:-}" ;;
*)
    echo "usage: scripts/gpu-first-run.sh prebuild|engine|validate|all|record BIN_DIR|report DIR" >&2
    exit 2
    ;;
esac
