"""The Hugging Face recorder: runs a transformers MoE model over prompts (generation with its KV
cache, batch >= 1), hooks every router and writes moesim's router trace (traces/FORMAT.md)
through libmoesim's trace writer (moesim_trace_write).

    python -m moesim.record_hf --model DIR_OR_ID --input prompts.txt -o trace.h5
    moesim.record_hf("DIR", [[1, 2, 3]], "t.h5", gen_len=8, batch=2)

Recorded per token and MoE layer: the top-k expert ids and gate weights the router hands to the
experts (python/README.md says how each family forms them), prefill/decode phase, request and
position, the token id; optionally the look-ahead predictions (layer l's router input through
the routers of layers l+1..l+D: top-K' of the softmax over all experts) and the token importance
(DyMoE Eq. 1: the attention probability a token receives at the layer, averaged over heads and
summed over every later query of its request; needs eager attention). Execution order is
`moesim record`'s: requests in groups of `batch`, each group's prompts one request after the
other, then its decode steps one token of every request per step. Families: record_hf_adapters.
Needs torch and transformers (not dependencies of the package)."""
import argparse
import ctypes
import json
import os
import re
import sys
import tempfile

import numpy as np

from ._lib import MoesimError, call as _call, enc, lib, take
from .record_hf_adapters import ADAPTERS, adapter_for, model_ini_text


class RecordError(Exception):
    """Bad input (model, prompts, options): one line, exit status 2 from the command line."""


class _TraceData(ctypes.Structure):  # include/moesim.h: moesim_trace_data
    _fields_ = [("model_config", ctypes.c_char_p), ("source", ctypes.c_char_p),
                ("params_json", ctypes.c_char_p), ("model_config_hash", ctypes.c_uint64),
                ("n_tokens", ctypes.c_size_t), ("request_id", ctypes.c_void_p),
                ("position", ctypes.c_void_p), ("phase", ctypes.c_void_p),
                ("token_id", ctypes.c_void_p), ("expert_ids", ctypes.c_void_p),
                ("gate_weights", ctypes.c_void_p), ("importance", ctypes.c_void_p),
                ("lookahead_depth", ctypes.c_uint32), ("lookahead_k", ctypes.c_uint32),
                ("lookahead_ids", ctypes.c_void_p), ("lookahead_scores", ctypes.c_void_p)]


# Every array write_trace takes: its element type and its shape by name (N tokens, L MoE layers,
# k top-k, D x K' look-ahead); the first five are required.
_ARRAYS = {"request_id": (np.uint32, "N"), "position": (np.uint32, "N"),
           "phase": (np.uint8, "N"), "expert_ids": (np.uint16, "NLk"),
           "gate_weights": (np.float32, "NLk"), "token_id": (np.int32, "N"),
           "importance": (np.float32, "NL"), "lookahead_ids": (np.uint16, "NLDK"),
           "lookahead_scores": (np.float32, "NLDK")}
_REQUIRED = ("request_id", "position", "phase", "expert_ids", "gate_weights")


def _array(key, value, dims):
    """`value` as the C-order array of _ARRAYS[key], its shape checked against `dims` (letter ->
    size, filled by the first array naming it); floats are rounded to float32, integers must
    fit their type."""
    dtype, shape = _ARRAYS[key]
    a = np.asarray(value)
    want = np.dtype(dtype)
    floats = want.kind == "f"
    if a.dtype.kind not in ("fiu" if floats else "iu"):
        raise TypeError(f"write_trace: {key}: expected {'numbers' if floats else 'integers'}, "
                        f"got dtype {a.dtype}")
    if a.ndim != len(shape):
        raise ValueError(f"write_trace: {key}: expected {len(shape)} dimensions "
                         f"[{']['.join(shape)}], got shape {list(a.shape)}")
    for letter, size in zip(shape, a.shape):
        if dims.setdefault(letter, size) != size:
            raise ValueError(f"write_trace: {key}: shape {list(a.shape)}, expected "
                             f"[{']['.join(str(dims.get(c, c)) for c in shape)}]")
    if not floats and a.size:  # integers kept exactly: no value wrapped into the type
        lo, hi = np.iinfo(want).min, np.iinfo(want).max
        if a.min() < lo or a.max() > hi:
            bad = a.min() if a.min() < lo else a.max()
            raise ValueError(f"write_trace: {key}: value {bad} outside {lo}..{hi} ({want})")
    return np.ascontiguousarray(a, dtype=want)


def write_trace(path, model_config, source, arrays, params=None):
    """Writes a trace from NumPy arrays (keys: request_id, position, phase, expert_ids,
    gate_weights, optional token_id, importance, lookahead_ids, lookahead_scores) and the model
    config's INI text, with libmoesim's writer. The arrays' shapes are checked against the
    model (N tokens, its L MoE layers, top-k) and their values against their types (ValueError,
    TypeError); the writer's checks raise MoesimError with its one-line message."""
    unknown = sorted(set(arrays) - set(_ARRAYS))
    if unknown:
        raise ValueError(f"write_trace: unknown array '{unknown[0]}' (expected "
                         f"{', '.join(_ARRAYS)})")
    missing = [k for k in _REQUIRED if arrays.get(k) is None]
    if missing:
        raise ValueError(f"write_trace: {missing[0]} is required")
    shape = json.loads(_call(lib().moesim_model_shape, model_config.encode()))
    dims = {"L": shape["layers"], "k": shape["top_k"]}
    held = {k: _array(k, v, dims) for k, v in arrays.items() if v is not None}
    if ("lookahead_ids" in held) != ("lookahead_scores" in held):
        raise ValueError("write_trace: lookahead_ids and lookahead_scores go together")
    d = _TraceData()
    d.model_config, d.source = model_config.encode(), source.encode()
    d.params_json = json.dumps(params).encode() if params is not None else None
    d.n_tokens = dims["N"]
    for k, a in held.items():
        setattr(d, k, a.ctypes.data)
    if "lookahead_ids" in held:
        d.lookahead_depth, d.lookahead_k = dims["D"], dims["K"]
    fn = lib().moesim_trace_write
    fn.argtypes = [ctypes.c_char_p, ctypes.POINTER(_TraceData), ctypes.POINTER(ctypes.c_void_p)]
    fn.restype = ctypes.c_int
    error = ctypes.c_void_p()
    status = fn(enc(str(path)), ctypes.byref(d), ctypes.byref(error))
    message = take(error)
    if status:
        raise MoesimError(message or f"moesim status {status}", status)


def load_prompts(path, vocab, tokenizer=None):
    """Prompts as lists of token ids: `moesim record`'s format (one prompt per line, ids
    separated by spaces or commas, or JSONL with "prompt_ids"; blank and '#' lines skipped), or,
    with a tokenizer, one text prompt per non-blank line."""
    prompts = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise RecordError(f"{path}: cannot read: {e}") from None
    for no, line in enumerate(lines, 1):
        s = line.strip()
        if not s or (tokenizer is None and s.startswith("#")):
            continue
        if tokenizer is not None:
            ids = tokenizer(s, add_special_tokens=True)["input_ids"]
        elif s.startswith("{"):
            try:
                ids = json.loads(s)["prompt_ids"]
            except (ValueError, KeyError, TypeError):
                raise RecordError(f"{path}:{no}: expected a JSON object with an integer array "
                                  "\"prompt_ids\"") from None
            if not isinstance(ids, list) or not all(type(v) is int for v in ids):
                raise RecordError(f"{path}:{no}: prompt_ids: expected an array of integers")
        else:
            fields = [t for t in re.split(r"[,\s]+", s) if t]
            if not all(re.fullmatch(r"-?[0-9]+", t) for t in fields):
                raise RecordError(f"{path}:{no}: expected token ids (integers separated by "
                                  "spaces or commas; --text reads text prompts)")
            ids = [int(t) for t in fields]
        bad = [v for v in ids if v < 0 or v >= vocab]
        if bad:
            raise RecordError(f"{path}:{no}: token id {bad[0]} outside the vocabulary "
                              f"[0, {vocab})")
        if not ids:
            raise RecordError(f"{path}:{no}: empty prompt")
        prompts.append(list(ids))
    if not prompts:
        raise RecordError(f"{path}: no prompts")
    return prompts


def _decoder_layers(model):
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise RecordError(f"{model.config.model_type}: no decoder layers at model.model.layers")
    return list(layers)


class _Hooks:
    """Forward hooks on the routers (and, for importance, the attention of MoE layers): each
    forward call of the model appends one entry per MoE layer."""

    def __init__(self, routers, attns, lookahead, lookahead_k, gate_scale):
        self.routers, self.lookahead, self.lookahead_k = routers, lookahead, lookahead_k
        self.gate_scale = gate_scale
        self.steps = [[] for _ in routers]  # [layer][forward call] = (ids, gates, la_ids, la_sc)
        self.attn = [[] for _ in routers]   # [layer][forward call] = [B][q][kv] head-mean probs
        self.handles = [r.register_forward_hook(self._router_hook(m))
                        for m, r in enumerate(routers)]
        self.handles += [a.register_forward_hook(self._attn_hook(m)) for m, a in enumerate(attns)]
        self.inside = False  # a look-ahead call of a later router is not a routing step

    def _router_hook(self, m):
        import torch

        def hook(module, args, output):
            if self.inside:
                return
            _, gates, ids = output[:3]
            gates = gates.detach().float().reshape(ids.shape[0], -1).cpu().numpy()
            ids = ids.detach().reshape(gates.shape).cpu().numpy()
            la = None
            if self.lookahead:
                h = args[0].reshape(ids.shape[0], -1)
                la = self._lookahead(m, h, torch)
            self.steps[m].append((ids, gates / self.gate_scale, la))
        return hook

    def _lookahead(self, m, h, torch):
        L, D, K = len(self.routers), self.lookahead, self.lookahead_k
        la_ids = np.full((h.shape[0], D, K), 0xFFFF, np.uint16)
        la_sc = np.zeros((h.shape[0], D, K), np.float32)
        self.inside = True
        try:
            with torch.no_grad():
                for d in range(1, D + 1):
                    if m + d >= L:
                        break
                    logits = self.routers[m + d](h)[0].float()
                    top = torch.topk(torch.softmax(logits, dim=-1), K, dim=-1)
                    la_ids[:, d - 1] = top.indices.cpu().numpy()
                    la_sc[:, d - 1] = top.values.cpu().numpy()
        finally:
            self.inside = False
        return la_ids, la_sc

    def _attn_hook(self, m):
        def hook(module, args, output):
            w = output[1]
            if w is None:
                raise RecordError("importance needs the attention probabilities: load the "
                                  "model with attn_implementation='eager'")
            # [B, heads, q, kv] -> [B, q, kv]: the probability each key receives, per query
            self.attn[m].append(w.detach().float().mean(dim=1).cpu().numpy())
        return hook

    def clear(self):
        self.steps = [[] for _ in self.routers]
        self.attn = [[] for _ in self.routers]

    def remove(self):
        for h in self.handles:
            h.remove()


def _group_rows(hooks, group, first_req, prompts, gen_len, importance, generated):
    """The trace rows of one group of requests from its hooks' entries, in execution order."""
    P = max(len(prompts[r]) for r in group)
    B = len(group)
    L = len(hooks.routers)
    rows = {k: [] for k in ("request_id", "position", "phase", "token_id", "expert_ids",
                            "gate_weights", "lookahead_ids", "lookahead_scores", "importance")}
    for m in range(L):
        if len(hooks.steps[m]) != gen_len + 1:
            raise RecordError(f"layer {m}: {len(hooks.steps[m])} router calls for "
                              f"{gen_len + 1} forward passes (did generation stop early?)")
    # (step, flat row in that step's batch, padded position) of every token, in trace order
    order = []
    for s, r in enumerate(group):
        pad = P - len(prompts[r])
        order += [(0, s * P + pad + t, pad + t, s, t, 0) for t in range(len(prompts[r]))]
    for j in range(gen_len):
        order += [(1 + j, s, P + j, s, len(prompts[r]) + j, 1) for s, r in enumerate(group)]
    imp = None
    if importance:
        imp = np.zeros((L, B, P + gen_len + 1), np.float32)
        # padding queries of the prompt pass are left out: transformers lets a query that
        # sees no real key attend to every key, real ones included
        real_q = np.zeros((B, P, 1), np.float32)
        for s, r in enumerate(group):
            real_q[s, P - len(prompts[r]):] = 1
        for m in range(L):
            for call, w in enumerate(hooks.attn[m]):
                imp[m, :, :w.shape[2]] += (w * real_q if call == 0 else w).sum(axis=1)
    for step, flat, padded, s, pos, phase in order:
        rows["request_id"].append(first_req + s)
        rows["position"].append(pos)
        rows["phase"].append(phase)
        n = len(prompts[group[s]])  # a decode token is the one generated before it
        rows["token_id"].append(prompts[group[s]][pos] if pos < n
                                else int(generated[s, P + pos - n]))
        rows["expert_ids"].append([hooks.steps[m][step][0][flat] for m in range(L)])
        rows["gate_weights"].append([hooks.steps[m][step][1][flat] for m in range(L)])
        if hooks.lookahead:
            rows["lookahead_ids"].append([hooks.steps[m][step][2][0][flat] for m in range(L)])
            rows["lookahead_scores"].append([hooks.steps[m][step][2][1][flat]
                                             for m in range(L)])
        if imp is not None:
            rows["importance"].append(imp[:, s, padded])
    return rows


def _sort_by_gate(ids, gates):
    """Each row highest gate first (stable: the router's order among equal gates), as the
    engine stores them; routers with sorted=False (DeepSeek) return them unordered."""
    order = np.argsort(-gates, axis=-1, kind="stable")
    return np.take_along_axis(ids, order, -1), np.take_along_axis(gates, order, -1)


def _load_config(model, trust_remote_code):
    """The config of a checkpoint path or hub id, refused unless an adapter reads its router."""
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as e:
        raise RecordError(f"{model}: cannot read its config.json: {str(e).splitlines()[0]}") \
            from None
    _check_family(cfg, model)
    return cfg


def _check_family(cfg, origin):
    if adapter_for(cfg.model_type) is None:
        raise RecordError(f"{origin}: model_type '{cfg.model_type}': no router adapter (known: "
                          f"{', '.join(sorted(ADAPTERS))})")


def _load_weights(model, dtype, importance, trust_remote_code):
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = {"auto": "auto", "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
                   "fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16,
                   "float16": torch.float16}.get(dtype)
    if torch_dtype is None:
        raise RecordError(f"--dtype: expected auto, bf16, fp16 or fp32, got '{dtype}'")
    kw = {"dtype": torch_dtype, "trust_remote_code": trust_remote_code}
    if importance:
        kw["attn_implementation"] = "eager"
    try:
        return AutoModelForCausalLM.from_pretrained(model, **kw)
    except (OSError, ValueError) as e:
        raise RecordError(f"{model}: cannot load: {str(e).splitlines()[0]}") from None


def record_hf(model, prompts, output, *, gen_len=32, batch=1, lookahead=0, lookahead_k=None,
              importance=False, dtype="auto", temperature=0.0, seed=0, name=None,
              write_model_ini=None, tokenizer=False, trust_remote_code=False):
    """Records the router trace of `model` (a checkpoint folder or hub id, or a loaded
    transformers model) over `prompts` (lists of token ids, or a file in `moesim record`'s
    format; text lines with tokenizer=True) into `output`. Returns a summary dict. Raises
    RecordError for bad input, MoesimError when the trace is refused."""
    import torch
    import transformers

    if batch < 1 or gen_len < 0 or not 0 <= lookahead <= 16:
        raise RecordError("expected batch >= 1, gen_len >= 0 and 0 <= lookahead <= 16")
    loaded = not isinstance(model, (str, os.PathLike))
    origin = str(getattr(model.config, "_name_or_path", "") or "model") if loaded else str(model)
    cfg = model.config if loaded else _load_config(model, trust_remote_code)
    _check_family(cfg, origin)
    if isinstance(prompts, (str, os.PathLike)):  # checked before the weights are loaded
        tok = None
        if tokenizer:
            from transformers import AutoTokenizer
            tok = AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code)
        prompts = load_prompts(prompts, cfg.vocab_size, tok)
    m = model if loaded else _load_weights(model, dtype, importance, trust_remote_code)
    adapter = adapter_for(cfg.model_type)
    layers = _decoder_layers(m)
    moe = [i for i, ly in enumerate(layers)
           if getattr(getattr(ly, "mlp", None), adapter.router_attr, None) is not None]
    if not moe:
        raise RecordError(f"{origin}: no layer has a router at mlp.{adapter.router_attr}")
    routers = [getattr(layers[i].mlp, adapter.router_attr) for i in moe]
    E = adapter.n_experts(cfg)
    K = lookahead_k if lookahead_k is not None else min(16, E)
    if lookahead and not 1 <= K <= E:
        raise RecordError(f"lookahead_k: expected 1..{E} (the experts), got {K}")
    attns = [layers[i].self_attn for i in moe] if importance else []
    name = name or re.sub(r"[^A-Za-z0-9._-]", "-", os.path.basename(str(origin).rstrip("/")))[:63]
    ini = model_ini_text(cfg, adapter, name, moe, origin)
    scale = adapter.gate_scale(cfg)
    hooks = _Hooks(routers, attns, lookahead, K, scale)
    m.eval()
    torch.manual_seed(seed)
    parts = []
    try:
        for g0 in range(0, len(prompts), batch):
            group = list(range(g0, min(g0 + batch, len(prompts))))
            P = max(len(prompts[r]) for r in group)
            ids = torch.zeros((len(group), P), dtype=torch.long)
            mask = torch.zeros((len(group), P), dtype=torch.long)
            for s, r in enumerate(group):  # left padding: every prompt ends at column P - 1
                ids[s, P - len(prompts[r]):] = torch.tensor(prompts[r])
                mask[s, P - len(prompts[r]):] = 1
            hooks.clear()
            with torch.no_grad():
                out = m.generate(input_ids=ids, attention_mask=mask, max_new_tokens=gen_len + 1,
                                 min_new_tokens=gen_len + 1, do_sample=temperature > 0,
                                 temperature=temperature if temperature > 0 else None,
                                 top_k=None, top_p=None, eos_token_id=None, pad_token_id=0,
                                 use_cache=True)
            parts.append(_group_rows(hooks, group, g0, prompts, gen_len, importance, out))
    finally:
        hooks.remove()

    def cat(key, dtype):
        return np.asarray([v for p in parts for v in p[key]], dtype=dtype)
    expert_ids, gates = _sort_by_gate(cat("expert_ids", np.int64), cat("gate_weights", np.float32))
    arrays = {"request_id": cat("request_id", np.uint32), "position": cat("position", np.uint32),
              "phase": cat("phase", np.uint8), "token_id": cat("token_id", np.int32),
              "expert_ids": expert_ids, "gate_weights": gates,
              "importance": cat("importance", np.float32) if importance else None,
              "lookahead_ids": cat("lookahead_ids", np.uint16) if lookahead else None,
              "lookahead_scores": cat("lookahead_scores", np.float32) if lookahead else None}
    params = {"recorder": "moesim.record_hf", "checkpoint": str(origin),
              "model_type": cfg.model_type, "dtype": str(next(m.parameters()).dtype),
              "gen_len": gen_len, "batch": batch, "temperature": temperature, "seed": seed,
              "gate_rule": adapter.rule, "gate_scale": scale,
              "torch": torch.__version__, "transformers": transformers.__version__}
    write_trace(output, ini, f"hf:transformers-{transformers.__version__}", arrays, params)
    if write_model_ini:
        _write_atomic(write_model_ini, ini)
    return {"output": str(output), "model": name, "requests": len(prompts),
            "tokens": int(len(arrays["request_id"])),
            "prefill_tokens": int((arrays["phase"] == 0).sum()),
            "decode_tokens": int((arrays["phase"] == 1).sum()), "moe_layers": len(moe),
            "experts": E, "top_k": int(expert_ids.shape[2]), "model_layers": moe}


def _write_atomic(path, text):
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-model-ini-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m moesim.record_hf",
        description="Runs a transformers MoE model over prompts (generation with its KV cache) "
                    "and writes its router trace (traces/FORMAT.md).")
    p.add_argument("--model", required=True, help="checkpoint folder or hub id")
    p.add_argument("--input", required=True,
                   help="prompts: token ids as `moesim record` reads them, or text with --text")
    p.add_argument("-o", "--output", required=True, help="the trace (.h5)")
    p.add_argument("--text", action="store_true",
                   help="the input holds one text prompt per line (the model's tokenizer)")
    p.add_argument("--gen-len", type=int, default=32, help="decode tokens per request (32)")
    p.add_argument("--batch", type=int, default=1, help="requests generated together (1)")
    p.add_argument("--lookahead", type=int, default=0, help="look-ahead distances D, 0..16 (0)")
    p.add_argument("--lookahead-k", type=int, default=None,
                   help="candidates per distance (16, or E when E < 16)")
    p.add_argument("--importance", action="store_true",
                   help="record token importance (loads the model with eager attention)")
    p.add_argument("--dtype", default="auto", help="auto (the checkpoint's), bf16, fp16, fp32")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (0)")
    p.add_argument("--name", default=None, help="the trace's model name (default: the folder's)")
    p.add_argument("--write-model-ini", metavar="FILE", default=None,
                   help="also write the model config (INI) for `moesim sim --model FILE`")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow a checkpoint's own modeling code (transformers' option)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch's CPU threads (default: torch's choice, all cores)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    a = p.parse_args(argv)
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"moesim.record_hf: needs torch and transformers ({e})", file=sys.stderr)
        return 2
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    transformers.utils.logging.set_verbosity_error()  # stderr keeps to our one line
    transformers.utils.logging.disable_progress_bar()
    try:
        s = record_hf(a.model, a.input, a.output, gen_len=a.gen_len, batch=a.batch,
                      lookahead=a.lookahead, lookahead_k=a.lookahead_k,
                      importance=a.importance, dtype=a.dtype, temperature=a.temperature,
                      seed=a.seed, name=a.name, write_model_ini=a.write_model_ini,
                      tokenizer=a.text, trust_remote_code=a.trust_remote_code)
    except (RecordError, MoesimError) as e:
        print(f"moesim.record_hf: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(s, indent=2))
    else:
        print(f"{s['output']}: {s['tokens']} tokens ({s['prefill_tokens']} prefill, "
              f"{s['decode_tokens']} decode) of {s['requests']} requests, {s['moe_layers']} MoE "
              f"layers, {s['experts']} experts, top-{s['top_k']}")
    return 0


class _CallableModule(type(sys)):
    """moesim.record_hf(...) is record_hf(...): the module is the API function too."""

    def __call__(self, *args, **kwargs):
        return record_hf(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
