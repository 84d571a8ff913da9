#!/usr/bin/env bash
# Seed corpora for every harness of tests/fuzz, made from the repo's own configs, experiments,
# fixtures and small traces written by moesim itself, so each fuzzer starts from well-formed,
# real-shaped inputs:  make_seeds.sh MOESIM_BINARY OUT_ROOT  (one folder per harness under
# OUT_ROOT; run from the repository root). Same repo, same seeds: nothing here is random.
set -euo pipefail
moesim=${1:?usage: make_seeds.sh MOESIM_BINARY OUT_ROOT}
root=${2:?usage: make_seeds.sh MOESIM_BINARY OUT_ROOT}
moesim=$(realpath "$moesim")
for t in safetensors config experiment import_jsonl import_csv import_npy import_npz trace trace_h5; do
    rm -rf "${root:?}/$t"
    mkdir -p "$root/$t"
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# ---- safetensors: the golden checkpoints' real headers (names, dtypes, __metadata__), with
# every tensor shrunk to one element so the whole file stays small enough to mutate quickly.
out=$root/safetensors
for f in tests/fixtures/golden/*/model.safetensors; do
    arch=$(basename "$(dirname "$f")")
    python3 - "$f" > "$out/golden-$arch" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
size = {"F32": 4, "F16": 2, "BF16": 2}
off = 0
for name, t in header.items():
    if name == "__metadata__":
        continue
    t["shape"] = [1]
    t["data_offsets"] = [off, off + size[t["dtype"]]]
    off += size[t["dtype"]]
h = json.dumps(header, separators=(",", ":")).encode()
sys.stdout.buffer.write(struct.pack("<Q", len(h)) + h + bytes(off))
PY
done
header() { # $1: JSON header, $2: data bytes
    python3 -c 'import struct,sys; h=sys.argv[1].encode(); sys.stdout.buffer.write(struct.pack("<Q",len(h))+h+bytes(int(sys.argv[2])))' "$1" "$2"
}
header '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' 8 > "$out/one-tensor"
header '{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]}}' 12 > "$out/metadata"
header '{"a":{"dtype":"F16","shape":[],"data_offsets":[0,2]},"b":{"dtype":"F16","shape":[0],"data_offsets":[2,2]}}' 2 > "$out/scalar-empty"

# ---- config: every INI file the project ships (hardware, models, policies, quantization),
# and a --set style settings file as `moesim sim --config` takes it.
for f in configs/*.ini configs/*/*.ini; do
    cp "$f" "$root/config/$(echo "${f#configs/}" | tr / -)"
done
cat > "$root/config/settings.ini" <<'EOF'
[sim]
seed = 7
[memory]
budget_gb = 24
[batch]
size = 4
[lru]
EOF

# ---- experiment: every experiment file, and one of each range form.
for f in experiments/*.ini experiments/*/*.ini; do
    cp "$f" "$root/experiment/$(echo "${f#experiments/}" | tr / -)"
done
cat > "$root/experiment/ranges.ini" <<'EOF'
[experiment]
name = ranges
evaluator = sim
[fixed]
model = mixtral-8x7b
hw = a6000
trace = t.h5
[axes]
policy = lru, dymoe
memory.budget_gb = 8:32:8
dymoe.lambda = 0.0:1.0:0.25
[exclude]
policy=lru, dymoe.lambda!=0.0
[traces]
t.h5 = --model mixtral-8x7b --requests 2 --prompt-len 4 --gen-len 4
EOF

# ---- traces and logs: the two models the import harness uses (real configs cut to a few
# layers, import_harness.h), traces synthesized on them and exported as the importer reads.
sed -e 's/^n_layers = 32 /n_layers = 2 /' configs/models/mixtral-8x7b.ini > "$work/mixtral2.ini"
sed -e 's/^n_layers = 27 /n_layers = 3 /' -e 's/^moe_layers = 1-26 /moe_layers = 1-2 /' \
    configs/models/deepseek-v2-lite.ini > "$work/deepseek3.ini"
synth() { # $1: model ini, $2: output, rest: synth options
    local m=$1 o=$2
    shift 2
    "$moesim" trace synth --model "$m" -q -o "$o" "$@"
}
synth "$work/mixtral2.ini" "$root/trace/mixtral2-lookahead.h5" --requests 2 --prompt-len 3 \
    --gen-len 2 --lookahead 1 --lookahead-k 2
synth "$work/deepseek3.ini" "$root/trace/deepseek3-plain.h5" --requests 2 --prompt-len 2 \
    --gen-len 2 --lookahead 0
synth "$work/mixtral2.ini" "$work/m.h5" --requests 3 --prompt-len 3 --gen-len 3 --seed 2
synth "$work/deepseek3.ini" "$work/d.h5" --requests 2 --prompt-len 2 --gen-len 3 --seed 3

# Byte 0 of an import seed holds the harness's option bits (import_harness.h): bit 0 the model
# (0 Mixtral cut to 2 layers, 1 DeepSeek cut to 3), 1 drop incomplete, 2 model layer numbering,
# 3 renormalize, 4 drop constant runs, 5 prefill tokens, 6 short constant runs.
seed() { # $1: option byte (decimal), $2: output; the log on stdin
    { printf "\\$(printf '%03o' "$1")"; cat; } > "$2"
}
for fmt in jsonl csv; do
    out=$root/import_$fmt
    # (2>/dev/null: the note that importance and look-ahead have no column)
    "$moesim" trace export --quiet --format $fmt "$work/m.h5" > "$work/m.$fmt" 2>/dev/null
    "$moesim" trace export --quiet --format $fmt "$work/d.h5" > "$work/d.$fmt" 2>/dev/null
    seed 0 "$out/mixtral-export" < "$work/m.$fmt"
    seed 1 "$out/deepseek-export" < "$work/d.$fmt"
    seed 64 "$out/mixtral-export-short-runs" < "$work/m.$fmt"
    # layer-major: every token of layer 0, then layer 1 (the order of a per-layer hook)
    python3 - "$fmt" "$work/m.$fmt" > "$work/m-layer-major.$fmt" <<'PY'
import sys
fmt = sys.argv[1]
lines = open(sys.argv[2]).read().splitlines()
head, rows = (lines[:1], lines[1:]) if fmt == "csv" else ([], lines)
key = (lambda r: int(r.split(",")[3])) if fmt == "csv" else (lambda r: r.split('"layer": ')[1].split(",")[0])
print("\n".join(head + sorted(rows, key=key)))
PY
    seed 0 "$out/mixtral-layer-major" < "$work/m-layer-major.$fmt"
    # incomplete tokens (one layer left out of every third record pair), kept and dropped
    awk 'NR % 3 != 2' "$work/m.$fmt" > "$work/m-gaps.$fmt"
    seed 0 "$out/mixtral-incomplete-keep" < "$work/m-gaps.$fmt"
    seed 2 "$out/mixtral-incomplete-drop" < "$work/m-gaps.$fmt"
done
# JSONL only: phases from --prefill-tokens (records without "phase"), model layer numbering,
# gates to renormalize, the problem shape, blank lines, escapes and keys the shape ignores.
sed -e 's/"phase": "[a-z]*", //' "$work/m.jsonl" | seed 32 "$root/import_jsonl/mixtral-prefill-tokens"
sed -e 's/"phase": "[a-z]*", //' -e 's/"layer": 1,/"layer": 2,/' -e 's/"layer": 0,/"layer": 1,/' \
    "$work/d.jsonl" | seed 5 "$root/import_jsonl/deepseek-model-layers"
seed 8 "$root/import_jsonl/renormalize" <<'EOF'
{"req_id": "a", "token_idx": 0, "layer": 0, "topk_ids": [1, 2], "topk_weights": [0.5, 0.3]}
{"req_id": "a", "token_idx": 0, "layer": 1, "topk_ids": [3, 0], "topk_weights": [0.6, 0.6]}
EOF
seed 1 "$root/import_jsonl/problem-shape" <<'EOF'
{"dataset": "gsm8k", "problem_id": 0, "token_idx": 0, "layer": 0, "experts": [0, 5, 7, 58, 12, 3], "gating_probs": [0.3, 0.2, 0.1, 0.1, 0.05, 0.05]}
{"layer": 1, "token_idx": 0, "problem_id": 0, "dataset": "gsm8k", "gating_probs": [0.3, 0.2, 0.1, 0.1, 0.05, 0.05], "experts": [1, 5, 7, 58, 12, 3]}

{"experts":[2,5,7,58,12,3],"gating_probs":[0.3,0.2,0.1,0.1,0.05,0.05],"dataset":"humaneval\u00e9","problem_id":1,"layer":0,"token_idx":0,"note":{"x":[1,2.5e-3,null,true]}}
EOF
seed 80 "$root/import_jsonl/constant-run-dropped" < <(for t in 0 1 2 3; do
    for l in 0 1; do
        echo "{\"req_id\": \"r\\\"1\", \"token_idx\": $t, \"layer\": $l, \"topk_ids\": [4, 6], \"topk_weights\": [0.75, 0.25]}"
    done
done)

# Dense arrays and one-record-per-token logs: the repo's import fixtures, made by their own
# generator (tests/fixtures/import/make_fixtures.py) for Mixtral cut to 2 layers.
python3 - "$work/fixtures" tests/fixtures/import <<'PY'
import os, sys
os.makedirs(sys.argv[1])
sys.path.insert(0, sys.argv[2])
import make_fixtures
make_fixtures.L = 2
os.chdir(sys.argv[1])
make_fixtures.main()
PY
for f in "$work"/fixtures/*.npz; do
    seed 0 "$root/import_npz/$(basename "$f" .npz)" < "$f"
    seed 128 "$root/import_npz/$(basename "$f" .npz)-uniform-gates" < "$f"
done
for f in "$work"/fixtures/*.jsonl; do
    seed 0 "$root/import_jsonl/$(basename "$f" .jsonl)" < "$f"
done
# npy: the ids' length (2 bytes, little-endian), the ids, the weights
npy_pair() { # $1: option byte, $2: output, $3: ids .npy, $4: weights .npy or nothing
    python3 -c 'import struct,sys; sys.stdout.buffer.write(struct.pack("<H", int(sys.argv[1])))' \
        "$(stat -c %s "$3")" | cat - "$3" ${4:+"$4"} | seed "$1" "$2"
}
npy_pair 0 "$root/import_npy/ids-weights" "$work/fixtures/ids.npy" "$work/fixtures/weights.npy"
npy_pair 128 "$root/import_npy/ids-uniform-gates" "$work/fixtures/ids.npy"

# ---- trace_h5: edit programs for the structure-aware trace harness, one of each kind of edit
# (encoding: fuzz_trace_h5.c, an op byte then its arguments); the empty program reads the
# harness's valid base trace unchanged.
python3 - "$root/trace_h5" <<'PY'
import os, struct, sys
out = sys.argv[1]
u64 = lambda v: struct.pack("<Q", v)
programs = {
    "unchanged": b"",
    "n-layers-zero": bytes([0, 5, 4, 0]) + u64(0),                     # attribute, u32 scalar
    "top-k-as-int64-array": bytes([0, 7, 7, 2]) + u64(2) + u64(2),      # attribute, i64[2]
    "format-is-topk": bytes([1, 0, 1, 1]),                              # string from the words
    "model-long-variable": bytes([1, 2, 6, 4]) + b"mixtral",            # long variable string
    "no-gate-normalization": bytes([2, 12]),                            # delete attribute
    "no-phase": bytes([3, 3]),                                          # delete dataset
    "gates-as-float64-chunked": bytes([4, 6, 9, 3, 6, 2, 2, 0x61, 4]) + b"\x00\x00\x80\x3f",
    "position-is-a-group": bytes([5, 2]),                               # dataset -> group
    "expert-id-out-of-range": bytes([6, 5, 3, 0]) + u64(0xFFF0),        # one element
    "garbage-gate-chunk": bytes([7, 6, 0, 0, 8]) + bytes(range(8)),     # one stored chunk
}
for name, prog in programs.items():
    open(os.path.join(out, name), "wb").write(prog)
PY
