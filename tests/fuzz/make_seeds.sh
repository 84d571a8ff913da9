#!/usr/bin/env bash
# Seeds for fuzz_safetensors: the real checkpoints of tests/fixtures/golden (header and a little
# data, so the fuzzer starts from well-formed files) and a few hand-made edge cases.
set -euo pipefail
out=${1:?usage: make_seeds.sh OUT_DIR}
mkdir -p "$out"
# The golden checkpoints' real headers (names, dtypes, __metadata__), with every tensor shrunk
# to one element so the whole file stays small enough to mutate quickly.
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
