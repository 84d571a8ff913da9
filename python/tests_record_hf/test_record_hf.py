"""moesim.record_hf on tiny random checkpoints made here with transformers, for every family the
installed transformers has: the trace equals the routing transformers computes (the router
logits the model itself returns with output_router_logits, through each family's gate rule
written out below, independently of the recorder's hooks), in bf16 and fp32, batch 1 and 3,
prompt and generation; for the families `moesim record` runs (Mixtral, Qwen2-MoE, Qwen3-MoE,
OLMoE) it equals the C engine's trace of the same fp32 safetensors checkpoint and prompts.
Needs torch and transformers: run by the slow ctest test python_record_hf
(python/run-record-hf-tests.sh makes their venv)."""
import functools
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from moesim.record_hf import main, record_hf  # noqa: E402

COMMON = dict(vocab_size=96, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
              rms_norm_eps=1e-6)
MLA = dict(kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=8,
           v_head_dim=8, first_k_dense_replace=1, intermediate_size=48, n_routed_experts=8,
           moe_intermediate_size=24, n_shared_experts=1, num_key_value_heads=4)
TINY = {  # model_type -> config keys (8 experts, top-2; some dense layers where a family has them)
    "mixtral": dict(intermediate_size=48, num_local_experts=8, num_experts_per_tok=2),
    "qwen2_moe": dict(intermediate_size=40, moe_intermediate_size=24, num_experts=8,
                      num_experts_per_tok=2, shared_expert_intermediate_size=40,
                      norm_topk_prob=False, mlp_only_layers=[1], use_sliding_window=False),
    "qwen3_moe": dict(moe_intermediate_size=24, intermediate_size=40, num_experts=8,
                      num_experts_per_tok=2, norm_topk_prob=True, head_dim=8,
                      mlp_only_layers=[2], use_sliding_window=False),
    "olmoe": dict(intermediate_size=24, num_experts=8, num_experts_per_tok=2,
                  norm_topk_prob=False),
    "deepseek_v2": dict(MLA, num_experts_per_tok=2, topk_method="group_limited_greedy",
                        n_group=4, topk_group=2, routed_scaling_factor=2.0),
    "deepseek_v3": dict(MLA, num_experts_per_tok=2, n_group=4, topk_group=2,
                        norm_topk_prob=True, routed_scaling_factor=2.5),
    "gpt_oss": dict(intermediate_size=24, num_local_experts=8, num_experts_per_tok=2,
                    head_dim=8, sliding_window=8),
    "phimoe": dict(intermediate_size=24, num_local_experts=8, num_experts_per_tok=2),
}
ENGINE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
FAMILIES = [t for t in TINY if t in transformers.models.auto.configuration_auto.CONFIG_MAPPING]
PROMPTS = [[5, 9, 13, 2, 7, 1], [3, 4], [11, 12, 13, 14], [8, 1, 2]]
GEN_LEN = 5


def _router(layer, model_type):
    """The router of a decoder layer, None for a dense one."""
    name = "router" if model_type in ("gpt_oss", "phimoe") else "gate"
    return getattr(getattr(layer, "mlp", None), name, None)


def tiny_model(model_type, dtype):
    """A random checkpoint of the family with sharp, tie-free routers."""
    cfg = transformers.AutoConfig.for_model(model_type, **{**COMMON, **TINY[model_type]})
    torch.manual_seed(1234)
    m = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for layer in m.model.layers:
            r = _router(layer, model_type)
            if r is None:
                continue
            r.weight.normal_(0, 1.0)
            if getattr(r, "bias", None) is not None:
                r.bias.normal_(0, 0.5)
            if hasattr(r, "e_score_correction_bias"):
                r.e_score_correction_bias.normal_(0, 0.2)
    return m.to(dtype).eval()


def _gate_rule(model_type, cfg, router, logits):
    """Top-k ids and the gates the family applies, from the router logits (transformers' rule
    for each family, written out; DeepSeek's routed_scaling_factor left out, as in the trace)."""
    k = cfg.num_experts_per_tok
    if model_type == "mixtral":
        p = torch.softmax(logits.float(), -1)
        v, i = torch.topk(p, k, -1)
        return i, v / v.sum(-1, keepdim=True)
    if model_type in ("qwen2_moe", "qwen3_moe", "olmoe"):
        p = torch.softmax(logits, -1, dtype=torch.float)
        v, i = torch.topk(p, k, -1)
        if cfg.norm_topk_prob:
            v = v / v.sum(-1, keepdim=True)
        return i, v.to(logits.dtype).float()
    if model_type == "gpt_oss":
        v, i = torch.topk(logits, k, -1)
        return i, torch.softmax(v, 1, dtype=v.dtype).float()
    if model_type == "deepseek_v2":
        p = logits.float().softmax(-1)
        g = p.view(-1, cfg.n_group, 8 // cfg.n_group).max(-1).values
        keep = torch.zeros_like(g).scatter_(1, torch.topk(g, cfg.topk_group, -1)[1], 1)
        p = p.masked_fill(~keep.repeat_interleave(8 // cfg.n_group, 1).bool(), 0.0)
        v, i = torch.topk(p, k, -1)
        return i, v
    if model_type == "deepseek_v3":
        s = logits.float().sigmoid()
        c = s + router.e_score_correction_bias
        g = c.view(-1, cfg.n_group, 8 // cfg.n_group).topk(2, -1)[0].sum(-1)
        keep = torch.zeros_like(g).scatter_(1, torch.topk(g, cfg.topk_group, -1)[1], 1)
        c = c.masked_fill(~keep.repeat_interleave(8 // cfg.n_group, 1).bool(), float("-inf"))
        i = torch.topk(c, k, -1)[1]
        v = s.gather(1, i)
        return i, v / (v.sum(-1, keepdim=True) + 1e-20)
    if model_type == "phimoe":  # sparsemixer in evaluation mode, top-2
        eps, out_i, out_v, s = cfg.router_jitter_noise, [], [], logits.clone()
        for _ in range(2):
            top, idx = s.max(-1, keepdim=True)
            factor = logits.abs().clamp(min=top)
            masked = s.masked_fill(((top - logits) / factor) > 2 * eps, float("-inf"))
            out_v.append(torch.softmax(masked, -1).gather(-1, idx))
            out_i.append(idx)
            s = s.scatter(-1, idx, float("-inf"))
        return torch.cat(out_i, -1), torch.cat(out_v, -1).float()
    raise AssertionError(model_type)


def _canonical(ids, gates):
    """Rows sorted by gate (descending), then id: the order is not part of the comparison."""
    order = np.lexsort((ids, -gates), axis=-1)
    return np.take_along_axis(ids, order, -1), np.take_along_axis(gates, order, -1)


def reference(m, model_type, prompts, batch, gen_len):
    """Per token in `moesim record`'s order: (request, position, phase, ids [L][k], gates),
    from the router logits transformers returns for each forward pass of generate."""
    calls = []
    forward = m.forward
    # with output_router_logits the model also computes its auxiliary load-balancing loss,
    # whose padding mask transformers sizes for the prompt pass only (batch > 1 fails on a
    # decode step): that loss is not routing, so it is stubbed for the reference run
    family = sys.modules[type(m).__module__]
    aux = getattr(family, "load_balancing_loss_func", None)
    if aux is not None:
        family.load_balancing_loss_func = lambda *a, **kw: torch.zeros(())

    @functools.wraps(forward)  # generate reads forward's signature (position_ids from the mask)
    def capture(*a, **kw):
        out = forward(*a, **kw)
        calls.append([t.detach() for t in out.router_logits])
        return out
    m.forward = capture
    routers = [r for r in (_router(ly, model_type) for ly in m.model.layers) if r is not None]
    rows = []
    try:
        for g0 in range(0, len(prompts), batch):
            group = prompts[g0:g0 + batch]
            P = max(map(len, group))
            ids = torch.tensor([[0] * (P - len(p)) + p for p in group])
            mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in group])
            calls.clear()
            with torch.no_grad():
                m.generate(input_ids=ids, attention_mask=mask, max_new_tokens=gen_len + 1,
                           min_new_tokens=gen_len + 1, do_sample=False, eos_token_id=None,
                           pad_token_id=0, output_router_logits=True, top_k=None, top_p=None,
                           temperature=None)
            assert len(calls) == gen_len + 1
            routed = [[_gate_rule(model_type, m.config, routers[li], lg) for li, lg in
                       enumerate(c)] for c in calls]
            for s, p in enumerate(group):
                for t in range(len(p)):
                    row = s * P + P - len(p) + t
                    rows.append((g0 + s, t, 0, [r[0][row] for r in routed[0]],
                                 [r[1][row] for r in routed[0]]))
            for j in range(gen_len):
                for s, p in enumerate(group):
                    rows.append((g0 + s, len(p) + j, 1, [r[0][s] for r in routed[1 + j]],
                                 [r[1][s] for r in routed[1 + j]]))
    finally:
        m.forward = forward
        if aux is not None:
            family.load_balancing_loss_func = aux
    ids = np.array([[x.numpy() for x in r[3]] for r in rows])
    gates = np.array([[x.float().numpy() for x in r[4]] for r in rows])
    return (np.array([r[0] for r in rows]), np.array([r[1] for r in rows]),
            np.array([r[2] for r in rows]), ids, gates)


def read(path):
    with h5py.File(path, "r") as f:
        return {k: f[k][()] for k in ("tokens/request_id", "tokens/position", "tokens/phase",
                                       "tokens/token_id", "routing/expert_ids",
                                       "routing/gate_weights")}, dict(f.attrs)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("model_type", FAMILIES)
def test_trace_equals_the_routing_transformers_computes(tmp_path, model_type, dtype, batch):
    m = tiny_model(model_type, torch.bfloat16 if dtype == "bf16" else torch.float32)
    out = tmp_path / "t.h5"
    s = record_hf(m, PROMPTS, out, gen_len=GEN_LEN, batch=batch, name=f"tiny-{model_type}")
    assert s["requests"] == 4 and s["tokens"] == sum(map(len, PROMPTS)) + 4 * GEN_LEN
    got, attrs = read(out)
    req, pos, phase, ids, gates = reference(m, model_type, PROMPTS, batch, GEN_LEN)
    np.testing.assert_array_equal(got["tokens/request_id"], req)
    np.testing.assert_array_equal(got["tokens/position"], pos)
    np.testing.assert_array_equal(got["tokens/phase"], phase)
    gi, gg = _canonical(got["routing/expert_ids"].astype(np.int64), got["routing/gate_weights"])
    ri, rg = _canonical(ids.astype(np.int64), gates.astype(np.float32))
    np.testing.assert_array_equal(gi, ri)
    np.testing.assert_allclose(gg, rg, rtol=1e-6, atol=0)
    assert attrs["n_layers"] == ids.shape[1] and attrs["top_k"] == 2 and attrs["n_experts"] == 8
    stored = json.loads(attrs["params_json"])
    assert f"name = tiny-{model_type}" in stored["model_config"]


def _save_fp32(model_type, folder):
    m = tiny_model(model_type, torch.float32)
    m.save_pretrained(folder, safe_serialization=True)
    return m


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("model_type", [t for t in ENGINE_FAMILIES if t in FAMILIES])
def test_trace_equals_moesim_record_on_the_same_checkpoint(tmp_path, model_type, batch):
    ckpt = tmp_path / model_type
    _save_fp32(model_type, ckpt)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(" ".join(map(str, p)) + "\n" for p in PROMPTS))
    hf, c = tmp_path / "hf.h5", tmp_path / "c.h5"
    assert main(["--model", str(ckpt), "--input", str(prompts), "-o", str(hf), "--gen-len",
                 str(GEN_LEN), "--batch", str(batch), "--lookahead", "2", "--importance"]) == 0
    p = subprocess.run([os.environ["MOESIM_BIN"], "record", "--model", str(ckpt), "--input",
                        str(prompts), "-o", str(c), "--gen-len", str(GEN_LEN), "--batch",
                        str(batch), "--lookahead", "2", "--threads", "1"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    with h5py.File(hf, "r") as a, h5py.File(c, "r") as b:
        for k in ("tokens/request_id", "tokens/position", "tokens/phase", "tokens/token_id",
                  "routing/expert_ids", "lookahead/expert_ids", "layers/model_layer"):
            np.testing.assert_array_equal(a[k][()], b[k][()], err_msg=k)
        for k in ("routing/gate_weights", "lookahead/scores", "routing/importance"):
            np.testing.assert_allclose(a[k][()], b[k][()], rtol=1e-4, atol=1e-5, err_msg=k)
        for k in ("n_layers", "n_experts", "top_k", "n_shared_experts", "gate_normalization"):
            assert a.attrs[k] == b.attrs[k], k


def test_sim_runs_on_the_trace_without_a_model_file_and_the_written_ini_loads(tmp_path):
    ckpt = tmp_path / "ck"
    _save_fp32(FAMILIES[0], ckpt)
    prompts = tmp_path / "p.txt"
    prompts.write_text("1 2 3\n4 5\n")
    t, ini = tmp_path / "t.h5", tmp_path / "m.ini"
    assert main(["--model", str(ckpt), "--input", str(prompts), "-o", str(t), "--gen-len", "3",
                 "--name", "tiny-unknown", "--write-model-ini", str(ini)]) == 0
    bin_ = os.environ["MOESIM_BIN"]
    sim = ["sim", "--trace", str(t), "--hw", "rtx3090-pcie3", "--policy", "lru", "--json"]
    p = subprocess.run([bin_, *sim], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    p2 = subprocess.run([bin_, *sim, "--model", str(ini)], capture_output=True, text=True)
    assert p2.returncode == 0, p2.stderr
    a, b = json.loads(p.stdout), json.loads(p2.stdout)
    assert a["tokens_per_s"] == b["tokens_per_s"]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    ckpt = tmp_path / "ck"
    _save_fp32(FAMILIES[0], ckpt)
    capsys.readouterr()
    cases = {"1 2 x\n": "p.txt:1: expected token ids",
             "1 2 999\n": "p.txt:1: token id 999 outside the vocabulary [0, 96)",
             "\n": "p.txt: no prompts"}
    out = tmp_path / "t.h5"
    for text, expect in cases.items():
        (tmp_path / "p.txt").write_text(text)
        assert main(["--model", str(ckpt), "--input", str(tmp_path / "p.txt"), "-o",
                     str(out)]) == 2
        err = capsys.readouterr().err
        assert expect in err and err.count("\n") == 1, err
        assert not out.exists()
    # a model whose router this recorder cannot read: refused in one line
    cfg = transformers.AutoConfig.for_model("llama", vocab_size=32, hidden_size=16,
                                            intermediate_size=16, num_hidden_layers=1,
                                            num_attention_heads=2)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "dense")
    (tmp_path / "p.txt").write_text("1 2\n")
    assert main(["--model", str(tmp_path / "dense"), "--input", str(tmp_path / "p.txt"), "-o",
                 str(out)]) == 2
    err = capsys.readouterr().err
    assert "model_type 'llama': no router adapter" in err and err.count("\n") == 1, err
