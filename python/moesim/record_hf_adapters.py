"""Per-family adapters of the Hugging Face recorder (moesim.record_hf): for each transformers
`model_type`, where a decoder layer's router is and what the model geometry is in the config.

In transformers 5 every MoE family here routes through a router module that returns
(router_logits, gate_weights, expert_ids) and hands the last two to its experts unchanged, so the
recorder hooks that module and records its output as the model applies it. An adapter names the
router's attribute on the layer's MoE block, the config keys of the geometry (configs/models/
README.md's INI keys), the gate rule, and a constant the model multiplies every gate by
(DeepSeek's routed_scaling_factor), which the trace leaves out so that gates stay in [0, 1]."""
from dataclasses import dataclass
from typing import Callable, Optional


def _get(cfg, *names, default=None):
    """The first of `names` the config has (not None), else `default`."""
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None:
            return v
    return default


def _norm_topk(cfg):
    return "topk" if _get(cfg, "norm_topk_prob", default=False) else "all"


@dataclass(frozen=True)
class Adapter:
    router_attr: str                       # the router module's attribute on layer.mlp
    n_experts: Callable                    # cfg -> routed experts per layer
    expert_inter: Callable                 # cfg -> routed expert FFN width
    gate_norm: Callable                    # cfg -> "topk" | "all" (FORMAT.md)
    shared: Callable = lambda cfg: (0, 0, False)  # cfg -> (n_shared, shared_inter, gated)
    dense_inter: Callable = lambda cfg: _get(cfg, "intermediate_size", default=0)
    qk_norm: bool = False
    mla: bool = False                      # DeepSeek multi-head latent attention
    gate_scale: Callable = lambda cfg: 1.0  # cfg -> constant factor on every gate
    rule: str = ""                         # how the gates are formed, for the trace's params


def _qwen2_shared(cfg):
    inter = _get(cfg, "shared_expert_intermediate_size", default=0)
    return (1, inter, True) if inter else (0, 0, False)


def _deepseek_shared(cfg):
    n = _get(cfg, "n_shared_experts", default=0)
    return (n, _get(cfg, "moe_intermediate_size"), False) if n else (0, 0, False)


ADAPTERS = {
    "mixtral": Adapter("gate", lambda c: c.num_local_experts, lambda c: c.intermediate_size,
                       lambda c: "topk", rule="softmax over all experts, top-k renormalized"),
    "qwen2_moe": Adapter("gate", lambda c: c.num_experts, lambda c: c.moe_intermediate_size,
                         _norm_topk, shared=_qwen2_shared,
                         rule="softmax over all experts, top-k (renormalized iff norm_topk_prob)"),
    "qwen3_moe": Adapter("gate", lambda c: c.num_experts, lambda c: c.moe_intermediate_size,
                         _norm_topk, qk_norm=True,
                         rule="softmax over all experts, top-k (renormalized iff norm_topk_prob)"),
    "olmoe": Adapter("gate", lambda c: c.num_experts, lambda c: c.intermediate_size, _norm_topk,
                     qk_norm=True,
                     rule="softmax over all experts, top-k (renormalized iff norm_topk_prob)"),
    "deepseek_v2": Adapter("gate", lambda c: _get(c, "n_routed_experts", "num_experts"),
                           lambda c: c.moe_intermediate_size, lambda c: "all",
                           shared=_deepseek_shared, mla=True,
                           gate_scale=lambda c: float(_get(c, "routed_scaling_factor",
                                                           default=1.0)),
                           rule="softmax over all experts, top-k (greedy or group-limited), "
                                "times routed_scaling_factor"),
    "deepseek_v3": Adapter("gate", lambda c: _get(c, "n_routed_experts", "num_local_experts"),
                           lambda c: c.moe_intermediate_size, _norm_topk,
                           shared=_deepseek_shared, mla=True,
                           gate_scale=lambda c: float(_get(c, "routed_scaling_factor",
                                                           default=1.0)),
                           rule="sigmoid scores, top-k of the top groups (with the correction "
                                "bias), renormalized iff norm_topk_prob, times "
                                "routed_scaling_factor"),
    "gpt_oss": Adapter("router", lambda c: c.num_local_experts, lambda c: c.intermediate_size,
                       lambda c: "topk", rule="top-k logits (with bias), softmax over them"),
    "phimoe": Adapter("router", lambda c: c.num_local_experts, lambda c: c.intermediate_size,
                      lambda c: "topk", rule="sparsemixer (evaluation mode): each of the top-2 "
                                             "a softmax over the experts near it"),
}


def adapter_for(model_type) -> Optional[Adapter]:
    return ADAPTERS.get(model_type)


def model_ini_text(cfg, adapter, name, moe_layers, origin):
    """The model config (configs/models/README.md's INI) of `cfg` with MoE layers `moe_layers`
    (model layer indices), citing the config.json keys it read."""
    n_layers = cfg.num_hidden_layers
    heads = cfg.num_attention_heads
    kv_heads = _get(cfg, "num_key_value_heads", default=heads)
    head_dim = _get(cfg, "head_dim", default=cfg.hidden_size // heads)
    if adapter.mla:
        head_dim = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    rope = _get(cfg, "rope_parameters", default={}) or {}
    theta = rope.get("rope_theta", _get(cfg, "rope_theta", default=10000.0))
    n_shared, shared_inter, shared_gate = adapter.shared(cfg)
    hf_id = str(getattr(cfg, "_name_or_path", "") or "none").replace(" ", "_").replace(";", "_")
    hf_id = hf_id if len(hf_id) < 128 else "none"
    dense = len(moe_layers) < n_layers
    layers = "all" if not dense else _ranges(moe_layers)
    lines = [
        f"; {name}: geometry written by moesim.record_hf from {origin}",
        "; Layout and key meanings: configs/models/README.md. Keys from its config.json.",
        "",
        "[model]",
        f"name = {name}",
        f"hf_id = {hf_id}",
        f"family = {cfg.model_type}",
        "",
        "[layers]",
        f"n_layers = {n_layers}",
        f"moe_layers = {layers}                 ; the layers whose MLP has a router",
        f"hidden = {cfg.hidden_size}",
        f"dense_inter = {adapter.dense_inter(cfg) if dense else 0}",
        f"vocab = {cfg.vocab_size}",
        f"tie_embeddings = {'true' if getattr(cfg, 'tie_word_embeddings', False) else 'false'}",
        "",
        "[experts]",
        f"n_experts = {adapter.n_experts(cfg)}",
        f"top_k = {cfg.num_experts_per_tok}",
        f"expert_inter = {adapter.expert_inter(cfg)}",
        f"gate_norm = {adapter.gate_norm(cfg)}",
        f"n_shared = {n_shared}",
        f"shared_inter = {shared_inter}",
        f"shared_gate = {'true' if shared_gate else 'false'}",
        "",
        "[attention]",
        f"kind = {'mla' if adapter.mla else 'gqa'}",
        f"heads = {heads}",
        f"kv_heads = {kv_heads}",
        f"head_dim = {head_dim}",
        f"qk_norm = {'true' if adapter.qk_norm else 'false'}",
        f"rope_theta = {float(theta):.17g}",
    ]
    if adapter.mla:
        lines += [f"q_lora_rank = {cfg.q_lora_rank or 0}", f"kv_lora_rank = {cfg.kv_lora_rank}",
                  f"qk_nope_head_dim = {cfg.qk_nope_head_dim}",
                  f"qk_rope_head_dim = {cfg.qk_rope_head_dim}", f"v_head_dim = {cfg.v_head_dim}"]
    return "\n".join(lines) + "\n"


def _ranges(layers):
    """[1, 2, 3, 5] -> "1-3,5" (moe_layers' syntax)."""
    out, i = [], 0
    while i < len(layers):
        j = i
        while j + 1 < len(layers) and layers[j + 1] == layers[j] + 1:
            j += 1
        out.append(str(layers[i]) if i == j else f"{layers[i]}-{layers[j]}")
        i = j + 1
    return ",".join(out)
