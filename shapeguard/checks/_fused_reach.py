"""The reach of the attention calls the trace sees whole, read from their arguments:
FlexAttention (its BlockMask's `mask_mod` on the traced sizes, `_reach/block_mask.py`)
and packed attention (`cu_seqlens`, causal, windows: `_reach/packed.py`) through
shapeguard's `flash_attention_varlen` and torch's `varlen_attn`, and xformers'
`memory_efficient_attention` (its `attn_bias`: `_xformers_reach`). Only values that can be read here count: CPU tensors; elsewhere (meta,
an accelerator) no reach is read, and nothing is claimed."""

from .. import _ops
from .._reach import block_mask, packed
from .._reach.rows import Reach, sampled_queries
from .._values import is_tensor
from ._view import CallView


def is_flex(func) -> bool:
    """Whether `func` is torch's own `flex_attention` (what the trace's wrapper hands on)."""
    return (
        getattr(func, "__module__", "") == "torch.nn.attention.flex_attention"
        and getattr(func, "__name__", "") == "flex_attention"
    )


def reach_at(call: CallView) -> Reach | None:
    """The call's reach, or None where it is not one of these calls or cannot be read."""
    spec = call.spec
    if spec is _ops.FLEX:
        return _flex(call) if is_flex(call.func) else None
    if spec.flash_form == "varlen":
        return _varlen(call)
    if spec is _ops.XFORMERS:
        from ._xformers_reach import reach_of

        return reach_of(call, _where(call))
    return None


def _where(call: CallView) -> dict:
    site = call.site
    module = call.module
    return {
        "op": call.op,
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
    score_mod = bound.get("score_mod")
    if mask is None and score_mod is None:
        return _unmasked(batch, heads, seq_q, seq_k, where)
    mask_mod = None
    if mask is not None:
        mask_mod = getattr(mask, "mask_mod", None)
        if mask_mod is None or tuple(int(s) for s in mask.seq_lengths) != (seq_q, seq_k):
            return None  # a mask for other lengths: `block_mask_shape` says so
    else:
        where["how"] = "score_mod"
    return block_mask.reach_of(mask_mod, batch, heads, seq_q, seq_k, score_mod, **where)


def _unmasked(batch: int, heads: int, seq_q: int, seq_k: int, where: dict) -> Reach:
    queries = sampled_queries(seq_q)
    kept = seq_q if queries is None else len(queries)
    return Reach.from_runs(
        [((0, seq_k),)] * kept, queries, seq_q, seq_k, (batch, heads), how="unmasked", **where
    )


def _varlen(call: CallView) -> Reach | None:
    """torch's `varlen_attn` (causal by its window (-1, 0)) or shapeguard's
    `flash_attention_varlen` (`causal=`): their arguments as the op table names them."""
    bound = call.bound()
    torch_entry = call.spec.flash_entry == "torch"
    if torch_entry:
        q, cu_q, cu_k = bound.get("query"), bound.get("cu_seq_q"), bound.get("cu_seq_k")
        if cu_k is None:
            cu_k = cu_q  # None shares the query's boundaries
    elif call.spec.flash_entry == "shapeguard":
        q, cu_q, cu_k = bound.get("q"), bound.get("cu_seqlens_q"), bound.get("cu_seqlens_k")
    else:
        return None  # flash-attn's own (not installed here): not read
    if not (is_tensor(q) and is_tensor(cu_q) and is_tensor(cu_k)) or q.dim() != 3:
        return None
    if any(t.device.type != "cpu" or t.dim() != 1 for t in (cu_q, cu_k)):
        return None
    window = _window(bound.get("window_size", (-1, -1)))
    if window is None:
        return None
    causal = window == (-1, 0) if torch_entry else bool(bound.get("causal", False))
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
