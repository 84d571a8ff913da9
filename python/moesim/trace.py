"""moesim.Trace: a router trace's arrays as NumPy (traces/FORMAT.md), read with h5py."""
import numpy as np

NO_EXPERT = 65535  # a row not recorded (/routing/expert_ids), or a look-ahead past the last layer


class Trace:
    """A trace file's contents. Arrays (N tokens, L MoE layers, k top-k, D look-ahead, K'):

    expert_ids    uint16 [N, L, k]   routed experts (NO_EXPERT rows: not recorded)
    gates         float32 [N, L, k]  gate weights as the model applies them
    phase         uint8 [N]          0 prefill, 1 decode
    request_id, position  uint32 [N]
    importance    float32 [N, L] or None
    lookahead_ids uint16 [N, L, D, K'] or None;  lookahead_scores float32, same shape, or None
    model_layer   uint32 [L]
    attrs         the file's attributes (model, format_version, ...) as a dict

    The file is validated by libmoesim first (moesim.trace_info), so a malformed trace raises
    MoesimError with moesim's message instead of giving arrays that break later."""

    def __init__(self, path, validate=True):
        import h5py

        from . import trace_info

        self.path = str(path)
        self.info = trace_info(self.path) if validate else None
        with h5py.File(self.path, "r") as f:
            self.attrs = {k: _attr(v) for k, v in f.attrs.items()}
            self.request_id = f["tokens/request_id"][:]
            self.position = f["tokens/position"][:]
            self.phase = f["tokens/phase"][:]
            self.token_id = f["tokens/token_id"][:] if "tokens/token_id" in f else None
            self.expert_ids = f["routing/expert_ids"][:]
            self.gates = f["routing/gate_weights"][:]
            self.importance = f["routing/importance"][:] if "routing/importance" in f else None
            la = "lookahead/expert_ids" in f
            self.lookahead_ids = f["lookahead/expert_ids"][:] if la else None
            self.lookahead_scores = f["lookahead/scores"][:] if la else None
            self.model_layer = f["layers/model_layer"][:]

    @property
    def n_tokens(self):
        return self.expert_ids.shape[0]

    @property
    def shape(self):
        """(N, L, k)."""
        return self.expert_ids.shape

    @property
    def prefill(self):
        """Boolean mask of prompt tokens."""
        return self.phase == 0

    def __repr__(self):
        n, layers, k = self.shape
        d = 0 if self.lookahead_ids is None else self.lookahead_ids.shape[2]
        return f"Trace({self.path!r}: {n} tokens, {layers} layers, top-{k}, look-ahead {d})"


def _attr(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray) and v.size == 1:
        return v.item()
    if isinstance(v, np.generic):
        return v.item()
    return v
