#!/usr/bin/env bash
# Recording speed of the Hugging Face recorder (python -m moesim.record_hf) against the C engine
# (moesim record) on the same checkpoint and prompts: the tiny OLMoE of tests/fixtures/golden
# (3 layers, 8 experts, top-2, hidden 64), 8 prompts of 12 tokens, 20 decode tokens each, batch
# 1 and 4, with and without look-ahead (D = 2) and importance. Prints tokens per second of wall
# time of the recording itself (model loading excluded), both on one thread.
# Needs a Python with torch and transformers (build/recorder-venv, made by the slow test
# python_record_hf, or PYTHON=...). Usage: bench/bench_record_hf.sh [MOESIM]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
moesim=${1:-$root/build/moesim}
python=${PYTHON:-$root/build/recorder-venv/bin/python}
ckpt=$root/tests/fixtures/golden/olmoe
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for r in $(seq 0 7); do seq -s ' ' $((r * 12 + 3)) $((r * 12 + 14)); done >"$work/prompts.txt"
export MOESIM_LIB=${MOESIM_LIB:-$root/build/libmoesim.so} PYTHONPATH=$root/python
echo "| recorder | batch | extras | tokens | tokens/s |"
echo "|---|---|---|---|---|"
for batch in 1 4; do
    for extras in "" "--lookahead 2 --importance"; do
        "$python" - "$ckpt" "$work/prompts.txt" "$work/hf.h5" "$batch" $extras <<'PY'
import sys, time
import torch, transformers
from moesim.record_hf import record_hf
transformers.utils.logging.disable_progress_bar()
torch.set_num_threads(1)  # both recorders on one thread: a shared machine
ckpt, prompts, out, extras = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[5:]
batch = int(sys.argv[4])
la, imp = (2, True) if extras else (0, False)
m = transformers.AutoModelForCausalLM.from_pretrained(
    ckpt, dtype="auto", **({"attn_implementation": "eager"} if imp else {}))
record_hf(m, prompts, out, gen_len=20, batch=batch, lookahead=la, importance=imp)  # warm-up
t = time.perf_counter()
s = record_hf(m, prompts, out, gen_len=20, batch=batch, lookahead=la, importance=imp)
dt = time.perf_counter() - t
print(f"| moesim.record_hf | {batch} | {' '.join(extras) or '-'} | {s['tokens']} | "
      f"{s['tokens'] / dt:.0f} |")
PY
        la=$([[ -n $extras ]] && echo 2 || echo 0)
        line=$("$moesim" record --model "$ckpt" --input "$work/prompts.txt" -o "$work/c.h5" \
            --gen-len 20 --batch "$batch" --lookahead "$la" --threads 1 --json)
        echo "$line" | "$python" -c 'import json, sys
j = json.load(sys.stdin)
print("| moesim record | %s | %s | %d | %.0f |" % (sys.argv[1], sys.argv[2], j["tokens"],
                                                  j["tokens_per_s"]))' "$batch" "${extras:--}"
    done
done
