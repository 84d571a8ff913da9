#!/usr/bin/env bash
# The C example over libmoesim simulates a synthesized trace and prints the same JSON as
# `moesim sim --json` (equal after parsing); a bad input comes back as a one-line error.
# usage: check.sh MOESIM LIBMOESIM_SIM WORKDIR
set -euo pipefail
moesim=$1 example=$2 work=$3
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$moesim" trace synth --model olmoe-1b-7b --requests 2 --prompt-len 8 --gen-len 16 --seed 5 \
    -o t.h5 >/dev/null
sets=(memory.budget_gb=2.5 expert.precision=int4)
"$example" t.h5 rtx3090-pcie3 lru "${sets[@]}" >lib.json
"$moesim" sim --trace t.h5 --hw rtx3090-pcie3 --policy lru --set "${sets[0]}" --set "${sets[1]}" \
    --json >cli.json
python3 -c '
import json, sys
a, b = json.load(open("lib.json")), json.load(open("cli.json"))
sys.exit(0 if a == b else "libmoesim and the CLI differ")'
rc=0
"$example" t.h5 rtx3090-pcie3 lru memory.nope=1 >out.txt 2>err.txt || rc=$?
[[ $rc == 2 && $(wc -l <err.txt) == 1 ]] && grep -q nope err.txt ||
    { echo "check.sh: a bad setting gave rc $rc: $(cat err.txt)" >&2; exit 1; }
echo "libmoesim example: same JSON as moesim sim"
