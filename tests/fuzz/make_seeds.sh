#!/usr/bin/env bash
# Seeds for fuzz_safetensors: the real checkpoints of tests/fixtures/golden (header and a little
# data, so the fuzzer starts from well-formed files) and a few hand-made edge cases.
set -euo pipefail
out=${1:?usage: make_seeds.sh OUT_DIR}
mkdir -p "$out"
for f in tests/fixtures/golden/*/model.safetensors; do
    arch=$(basename "$(dirname "$f")")
    head -c 4096 "$f" > "$out/golden-$arch"
done
header() { # $1: JSON header, $2: data bytes
    python3 -c 'import struct,sys; h=sys.argv[1].encode(); sys.stdout.buffer.write(struct.pack("<Q",len(h))+h+bytes(int(sys.argv[2])))' "$1" "$2"
}
header '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' 8 > "$out/one-tensor"
header '{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]}}' 12 > "$out/metadata"
header '{"a":{"dtype":"F16","shape":[],"data_offsets":[0,2]},"b":{"dtype":"F16","shape":[0],"data_offsets":[2,2]}}' 2 > "$out/scalar-empty"
