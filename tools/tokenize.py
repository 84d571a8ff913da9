#!/usr/bin/env python3
"""Turns text prompts into the token-id input of `moesim record` and `moesim eval`.

Input: ShareGPT-style JSON (a list of {"conversations": [{"from": "human", "value": ...}, ...]}
objects; the first human turn of each conversation is the prompt), or plain text with one prompt
per line. Output: JSONL, one {"prompt_ids": [...]} object per prompt, with the model's own Hugging
Face tokenizer (read from the checkpoint folder: no download).

    python3 tools/tokenize.py --model DIR prompts.txt -o prompts.jsonl
    python3 tools/tokenize.py --model DIR sharegpt.json --max-prompts 100 --max-len 512 -o p.jsonl

Needs `transformers` (pip install transformers); moesim itself never needs Python.
"""
import argparse
import json
import os
import sys

# This file's name shadows the standard library's `tokenize`, which transformers imports: drop the
# script's own folder from the module path before importing anything that needs it.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _here]


def read_prompts(path):
    """The prompts of a ShareGPT JSON file, or the non-empty lines of a text file."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            sys.exit(f"{path}: not valid JSON at line {e.lineno}: {e.msg}")
        prompts = []
        for i, conv in enumerate(data):
            turns = conv.get("conversations") if isinstance(conv, dict) else None
            if not isinstance(turns, list):
                sys.exit(f"{path}: item {i}: expected an object with a 'conversations' list")
            human = [t.get("value") for t in turns
                     if isinstance(t, dict) and t.get("from") in ("human", "user")]
            if human and isinstance(human[0], str) and human[0].strip():
                prompts.append(human[0])
        return prompts
    return [line for line in text.splitlines() if line.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input", help="ShareGPT JSON or text file (one prompt per line)")
    ap.add_argument("--model", required=True, help="checkpoint folder holding the tokenizer")
    ap.add_argument("-o", "--output", required=True, help="JSONL file of prompt_ids")
    ap.add_argument("--max-prompts", type=int, default=0, help="keep the first N (0: all)")
    ap.add_argument("--max-len", type=int, default=0, help="truncate prompts to N tokens (0: no)")
    args = ap.parse_args()

    try:
        from transformers import AutoTokenizer
    except ImportError:
        sys.exit("tools/tokenize.py needs transformers: pip install transformers")
    tok = AutoTokenizer.from_pretrained(args.model, local_files_only=True)

    prompts = read_prompts(args.input)
    if args.max_prompts:
        prompts = prompts[: args.max_prompts]
    if not prompts:
        sys.exit(f"{args.input}: no prompts found")
    with open(args.output, "w", encoding="utf-8") as out:
        for p in prompts:
            ids = tok(p)["input_ids"]
            if args.max_len:
                ids = ids[: args.max_len]
            out.write(json.dumps({"prompt_ids": ids}) + "\n")
    print(f"{args.output}: {len(prompts)} prompts", file=sys.stderr)


if __name__ == "__main__":
    main()
