"""The reach of the attention calls the trace sees whole, read from their arguments:
FlexAttention (its BlockMask's `mask_mod` on the traced sizes, `_reach/block_mask.py`)
and packed attention (`cu_seqlens`, causal, windows: `_reach/packed.py`) through
shapeguard's `flash_attention_varlen` and torch's `varlen_attn`. Only values that can be read here count: CPU tensors; elsewhere (meta,
an accelerator) no reach is read, and nothing is claimed."""

from .. import _ops
from .._reach import block_mask, packed
from .._reach.rows import Reach, sampled_queries
from .._values import is_tensor
from ._view import CallView


def reach_at(call: CallView) -> Reach | None:
    """The call's reach, or None where it is not one of these calls or cannot be read."""
    spec = call.spec
    if spec is _ops.FLEX:
        return _flex(call)
    if spec.flash_form == "varlen":
        return _varlen(call)
    return None


def _where(call: CallView) -> dict:
    site = call.site
    module = call.module
    return {
        "op": call.spec.name,
        "module": call.module_path(module) if module is not None else "",
        "location": site.location if site is not None else "",
    }


def _flex(call: CallView) -> Reach | None:
    bound = call.bound()
    q, k, mask = bound.get("query"), bound.get("key"), bound.get("block_mask")
    if not (is_tensor(q) and is_tensor(k)) or q.dim() != 4 or k.dim() != 4:
        return None
    if q.device.type != "cpu":
        return None
    batch, heads, seq_q, seq_k = int(q.shape[0]), int(q.shape[1]), int(q.shape[2]), int(k.shape[2])
    where = {**_where(call), "lead_axes": ("batch", "heads")}
    if mask is None:
        return _unmasked(batch, heads, seq_q, seq_k, where)
    mod = getattr(mask, "mask_mod", None)
    if mod is None or tuple(int(s) for s in mask.seq_lengths) != (seq_q, seq_k):
        return None  # a mask for other lengths: `block_mask_shape` says so
    return block_mask.reach_of(mod, batch, heads, seq_q, seq_k, **where)


def _unmasked(batch: int, heads: int, seq_q: int, seq_k: int, where: dict) -> Reach:
    queries = sampled_queries(seq_q)
    kept = seq_q if queries is None else len(queries)
    return Reach.from_runs(
        [((0, seq_k),)] * kept, queries, seq_q, seq_k, (batch, heads), how="unmasked", **where
    )


# Each packed entry point's arguments, in order: torch's `varlen_attn` and shapeguard's
# `flash_attention_varlen` (flash-attn's own is not installed here: not read).
_VARLEN_ORDER = {
    "varlen_attn": ("q", "k", "v", "cu_q", "cu_k"),
    "flash_attention_varlen": ("q", "k", "v", "cu_q", "cu_k"),
}
_VARLEN_KEYWORDS = {
    "query": "q", "key": "k", "value": "v", "cu_seq_q": "cu_q", "cu_seq_k": "cu_k",
    "cu_seqlens_q": "cu_q", "cu_seqlens_k": "cu_k",
}  # fmt: skip


def _varlen(call: CallView) -> Reach | None:
    name = call.spec.name
    if name not in _VARLEN_ORDER:
        return None
    given = dict(zip(_VARLEN_ORDER[name], call.args, strict=False))
    given.update({_VARLEN_KEYWORDS.get(key, key): value for key, value in call.kwargs.items()})
    q, cu_q, cu_k = given.get("q"), given.get("cu_q"), given.get("cu_k")
    if name == "varlen_attn" and cu_k is None:
        cu_k = cu_q  # torch's varlen_attn: None shares the query's boundaries
    if not (is_tensor(q) and is_tensor(cu_q) and is_tensor(cu_k)) or q.dim() != 3:
        return None
    if any(t.device.type != "cpu" or t.dim() != 1 for t in (cu_q, cu_k)):
        return None
    window = _window(given.get("window_size", (-1, -1)))
    if window is None:
        return None
    # torch's varlen_attn is causal by its window (-1, 0); shapeguard's takes `causal`.
    causal = window == (-1, 0) if name == "varlen_attn" else bool(given.get("causal", False))
    bounds_q = tuple(int(x) for x in cu_q.tolist())
    bounds_k = tuple(int(x) for x in cu_k.tolist())
    return packed.reach_of(
        bounds_q, bounds_k, int(q.shape[1]), causal=causal, window=window, **_where(call)
    )


def _window(value) -> tuple[int, int] | None:
    try:
        left, right = (int(v) for v in value)
    except (TypeError, ValueError):
        return None
    return left, right
