#!/usr/bin/env python3
"""Builds the golden fixtures of the engine tests: a tiny random model of each supported
architecture, made and run by Hugging Face transformers, saved in the real checkpoint format
(config.json + model.safetensors, bf16 weights), plus what transformers computes on a few prompts.

Usage: python3 -P tools/make_golden.py [OUT_DIR]   (default tests/fixtures/golden; -P keeps
tools/tokenize.py from shadowing Python's own tokenize module)
Needs torch, transformers and safetensors (pip install torch transformers safetensors).

For each fixture OUT_DIR/<name>/ holds (name: the model_type, or model_type_<feature> for a
configuration the plain fixture does not use):
  config.json, model.safetensors   the checkpoint (weights rounded to bf16)
  golden.safetensors               F32 tensors, per prompt i:
      prompt<i>.ids          [n]            token ids (exact small integers)
      prompt<i>.logits       [n][vocab]     next-token logits after each prompt position
      prompt<i>.topk_ids     [n][L][k]      experts the router chose, best first
      prompt<i>.topk_weights [n][L][k]      their gate weights as the model applies them
The reference runs in float64 on the bf16-rounded weights (the engine computes in fp32), with
eager attention and the eager per-expert loop. Router choices come from the model's own router logits (output_router_logits),
with the softmax / top-k / renormalization rule of the architecture, in torch. Deterministic:
fixed seeds.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

VOCAB, HIDDEN, LAYERS, EXPERTS, TOP_K, INTER = 256, 64, 3, 8, 2, 64
PROMPTS = [[1, 17, 42, 99, 3, 250, 7, 64], [200, 5, 5, 5, 130], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 255]]

COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
              num_attention_heads=4, num_key_value_heads=2, num_experts_per_tok=TOP_K,
              rms_norm_eps=1e-6, initializer_range=0.15, tie_word_embeddings=False,
              max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)

# A window shorter than the prompts, so that the window changes the result.
WINDOW = 4

ARCHS = {
    # Mixtral: softmax over all, top-2 renormalized
    "mixtral": dict(num_local_experts=EXPERTS, intermediate_size=INTER, rope_theta=1e6),
    # Qwen1.5-MoE: shared expert with sigmoid gate, q/k/v bias, no renormalization
    "qwen2_moe": dict(num_experts=EXPERTS, moe_intermediate_size=INTER, intermediate_size=128,
                      shared_expert_intermediate_size=128, norm_topk_prob=False,
                      rope_theta=1e6),
    # Qwen3-MoE: QK-norm per head, renormalized top-k, explicit head_dim
    "qwen3_moe": dict(num_experts=EXPERTS, moe_intermediate_size=INTER, intermediate_size=128,
                      head_dim=32, norm_topk_prob=True, rope_theta=1e6),
    # OLMoE: QK-norm over the whole projections, no renormalization
    "olmoe": dict(num_experts=EXPERTS, intermediate_size=INTER, norm_topk_prob=False,
                  rope_theta=1e4),
}

# Configurations beyond each architecture's defaults: name -> (model_type, keys over ARCHS').
VARIANTS = {
    # bias on q_proj, k_proj, v_proj and o_proj
    "qwen3_moe_attention_bias": ("qwen3_moe", dict(attention_bias=True)),
    "olmoe_attention_bias": ("olmoe", dict(attention_bias=True)),
    # the window on every layer
    "qwen3_moe_sliding_window": ("qwen3_moe", dict(use_sliding_window=True, sliding_window=WINDOW)),
    "mixtral_sliding_window": ("mixtral", dict(sliding_window=WINDOW)),
    # the config derives layer_types: sliding where (l + 1) % 2 and l < max_window_layers, so
    # [sliding, full, full] (saved in config.json)
    "qwen2_moe_sliding_window": ("qwen2_moe", dict(use_sliding_window=True, sliding_window=WINDOW,
                                                   max_window_layers=1)),
}


def route(cfg, model_type, logits):
    probs = torch.softmax(logits.double(), dim=-1)
    w, ids = torch.topk(probs, TOP_K, dim=-1)
    if model_type == "mixtral" or getattr(cfg, "norm_topk_prob", False):
        w = w / w.sum(dim=-1, keepdim=True)
    return ids, w


def build(name, model_type, keys, out_dir, seed):
    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(model_type, **COMMON, **{**ARCHS[model_type], **keys})
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    # norms at random scales around 1 and biases random (transformers initializes them to 1 and 0)
    # so that a wrong norm or a missing bias cannot hide
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(1.0 + 0.2 * torch.randn_like(p.float()))
            elif pname.endswith(".bias"):
                p.copy_(0.5 * torch.randn_like(p.float()))
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))
    # reference: reload the saved checkpoint and run it in float64 with the plain per-expert loop
    # (transformers' default grouped_mm expert path is less precise than fp32 on CPU)
    model = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager",
                                                 experts_implementation="eager").double().eval()
    tensors = {}
    for i, prompt in enumerate(PROMPTS):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model(input_ids=ids, output_router_logits=True, use_cache=False)
        layers = [route(cfg, model_type, rl.reshape(len(prompt), EXPERTS))
                  for rl in out.router_logits]
        tensors[f"prompt{i}.ids"] = torch.tensor(prompt, dtype=torch.float32)
        tensors[f"prompt{i}.logits"] = out.logits[0].float().contiguous()
        tensors[f"prompt{i}.topk_ids"] = torch.stack([l[0] for l in layers], 1).float().contiguous()
        tensors[f"prompt{i}.topk_weights"] = torch.stack([l[1] for l in layers], 1).float().contiguous()
    save_file(tensors, os.path.join(d, "golden.safetensors"),
              metadata={"transformers": __import__("transformers").__version__,
                        "torch": torch.__version__})
    print(name, "->", d, {k: list(v.shape) for k, v in tensors.items() if k.startswith("prompt0")})


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/golden"
    fixtures = [(t, t, {}) for t in ARCHS] + [(n, t, k) for n, (t, k) in VARIANTS.items()]
    for seed, (name, model_type, keys) in enumerate(fixtures):
        build(name, model_type, keys, out_dir, 1234 + seed)


if __name__ == "__main__":
    main()
