#!/usr/bin/env bash
# Timeline size per format (sim/README.md, "Timelines"): `moesim sim --timeline` of 2,000-token
# synthetic traces (8 requests x 200 prompt + 50 generated tokens; Qwen3-30B-A3B, and Mixtral-8x7B
# with int4 experts) on the a6000 profile with a 24 GiB budget under lru, written as Chrome JSON,
# gzip'd JSON and Perfetto protobuf; then a full-length protobuf timeline of a 10,000-token
# Qwen3-30B trace against the Perfetto UI's memory (see the README for the limit and its source).
# Prints Markdown tables: bytes, bytes per 1,000 tokens, how many times smaller than the JSON, the
# wall seconds of the run that wrote it, and for the protobuf its size inflated (what Perfetto's
# trace processor parses) and its slice count.
# Usage: bench/bench_timeline.sh [BUILD_DIR]   (needs python3 to inflate the protobuf's blocks)
set -euo pipefail
build=${1:-build}
moesim=$build/moesim
work=$(mktemp -d "${TMPDIR:-/tmp}/moesim-bench-timeline.XXXXXX")
trap 'rm -rf "$work"' EXIT
run=(--hw a6000 --policy lru --set memory.budget_gb=24)

# The protobuf's compressed_packets blocks inflated: "<bytes> <slices>" (a slice is a
# TrackEvent of type SLICE_BEGIN; field numbers: core/timeline_proto.h).
inflated() {
    python3 - "$1" <<'PY'
import sys, zlib
def fields(b):  # (field number, varint value or bytes) of one protobuf message
    i = 0
    while i < len(b):
        key = v = s = 0
        while True:
            key |= (b[i] & 0x7f) << s; i += 1; s += 7
            if b[i - 1] < 0x80: break
        s = 0
        while True:
            v |= (b[i] & 0x7f) << s; i += 1; s += 7
            if b[i - 1] < 0x80: break
        if key & 7 == 2:
            yield key >> 3, b[i:i + v]; i += v
        else:
            yield key >> 3, v
raw = slices = 0
for _, packet in fields(open(sys.argv[1], 'rb').read()):       # Trace.packet
    block = zlib.decompress(dict(fields(packet))[50])          # compressed_packets
    raw += len(block)
    for _, inner in fields(block):
        event = dict(fields(inner)).get(11)                    # track_event
        slices += event is not None and dict(fields(event)).get(9) == 1
print(raw, slices)
PY
}

seconds() { /usr/bin/time -f '%e' -o "$work/t" "$@" >/dev/null && cat "$work/t"; }

echo "| model | tokens | format | bytes | bytes / 1,000 tokens | x smaller than JSON | wall s |"
echo "|---|---|---|---|---|---|---|"
for model in qwen3-30b-a3b mixtral-8x7b; do
    trace=$work/$model.h5
    precision=bf16 # a bf16 Mixtral expert is 352 MB: 24 GiB leaves a layer fewer than top_k
    [ "$model" = mixtral-8x7b ] && precision=int4
    "$moesim" trace synth --model "$model" --requests 8 --prompt-len 200 --gen-len 50 --seed 1 \
        -q -o "$trace"
    tokens=2000
    json_bytes=0
    for ext in json json.gz pftrace; do
        out=$work/$model.$ext
        s=$(seconds "$moesim" sim --trace "$trace" "${run[@]}" --set expert.precision=$precision \
            --timeline "$out")
        bytes=$(stat -c %s "$out")
        [ "$ext" = json ] && json_bytes=$bytes
        awk -v m="$model" -v t="$tokens" -v e="$ext" -v b="$bytes" -v j="$json_bytes" -v s="$s" \
            'BEGIN { printf "| %s | %d | .%s | %d | %.0f | %.1f | %s |\n", m, t, e, b,
                     b * 1000 / t, j / b, s }'
    done
    read -r raw slices < <(inflated "$work/$model.pftrace")
    echo "| $model | $tokens | .pftrace inflated ($slices slices) | $raw |" \
         "$((raw * 1000 / tokens)) | | |"
    rm -f "$work/$model".json*
done

echo
echo "Windows of the Qwen3-30B run (JSON; 408 steps at batch 1: request r prefills its 200" \
     "tokens in step 51r, then decodes one token a step):"
echo "| window | bytes |"
echo "|---|---|"
for w in steps=0:1 steps=210:220 ms=10000:10100; do
    "$moesim" sim --trace "$work/qwen3-30b-a3b.h5" "${run[@]}" --timeline "$work/w.json" \
        --timeline-window "$w" >/dev/null
    echo "| $w | $(stat -c %s "$work/w.json") |"
done

# 10,000 tokens, the whole run: protobuf, and the JSON's size through gzip (not kept on disk)
trace=$work/q10k.h5
"$moesim" trace synth --model qwen3-30b-a3b --requests 40 --prompt-len 200 --gen-len 50 --seed 1 \
    -q -o "$trace"
s=$(seconds "$moesim" sim --trace "$trace" "${run[@]}" --timeline "$work/q10k.pftrace")
read -r raw slices < <(inflated "$work/q10k.pftrace")
"$moesim" sim --trace "$trace" "${run[@]}" --timeline "$work/q10k.json.gz" >/dev/null
echo
echo "Qwen3-30B, 10,000 tokens, whole run as .pftrace: $(stat -c %s "$work/q10k.pftrace") bytes" \
     "($s s), inflated $raw bytes, $slices slices; Perfetto UI budget: 4 x inflated =" \
     "$((4 * raw / 1048576)) MiB of 2048 MiB. As JSON: $(zcat "$work/q10k.json.gz" | wc -c) bytes."
