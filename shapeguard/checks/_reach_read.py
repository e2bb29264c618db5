"""An attention site's reach read from the values that reach softmax or the kernel: the
scores a softmax reads (whatever masks were added or filled in before), SDPA's attn_mask
and is_causal, nn.MultiheadAttention's attn_mask and key_padding_mask as torch combines
them, flash-attn's dense call (shapeguard.attention's or flash-attn's own: causal aligned
bottom-right, window_size). Each reader returns the bool `visible` rows (True where a key
can be seen) of the sampled queries only (`_reach.rows.query_sample`), so what it builds
stays within `MAX_ROWS` x seq_k, and `reach` turns them into a `Reach` (runs, never a
tensor).

Values are read only from readable tensors (small, plain, on the CPU: never meta, fake or
on an accelerator); elsewhere there is no reach, silently. Nothing here writes to a tensor.
"""

from typing import TYPE_CHECKING, NamedTuple, TypeGuard

from .. import _ops
from .._reach.rows import Reach, query_sample
from ._fused_reach import reach_at
from ._mask_effects import broadcasts_to, has_shape
from ._mask_effects import readable as _small_cpu
from ._mask_uses import HIDING, mask_uses
from .mha import bind_arguments

if TYPE_CHECKING:
    import torch

# Leading axes a reach names, where provenance names them so.
_NAMED = ("batch", "heads")


class _Read(NamedTuple):
    visible: "torch.Tensor"  # bool [..., kept queries, seq_k], broadcastable to lead
    lead: tuple[int, ...]
    seq_q: int
    seq_k: int
    queries: tuple[int, ...] | None  # the kept queries (None: all)
    how: str  # "mask", "causal", "window" or "unmasked" (`Reach.how`)
    lead_axes: tuple[str, ...]


def reach(call) -> Reach | None:
    """The reach of the attention site `call` is, or None where it cannot be read (an
    unreadable tensor, a softmax over scores no query-key product made, too many slices)."""
    op = call.spec
    if op is _ops.FLEX or op.flash_form in ("varlen", "xformers"):
        return reach_at(call)  # from the call's arguments: a mask_mod, cu_seqlens, attn_bias
    try:
        if op is _ops.SDPA:
            read = _sdpa(call)
        elif op is _ops.MHA:
            read = _mha(call)
        elif op.family == _ops.FLASH:
            read = _flash(call)
        else:
            read = _softmax(call)
        if read is None:
            return None
        sampled = (read.queries, read.seq_q) if read.queries is not None else None
        # A mask broadcast along the queries or keys ([batch, 1, 1, seq_k]) read as the
        # rows it stands for: a view, as many rows as kept.
        rows = len(read.queries) if read.queries is not None else read.seq_q
        visible = read.visible.expand(*read.visible.shape[:-2], rows, read.seq_k)
        return Reach.from_visible(
            visible,
            read.lead,
            sampled=sampled,
            op=call.op,
            module=call.module_path(call.module) if call.module is not None else "",
            location=call.site.location if call.site is not None else "",
            how=read.how,
            lead_axes=read.lead_axes,
        )
    except ValueError:
        return None  # past the bound on leading slices (`query_sample`): no reach


def readable(t) -> TypeGuard["torch.Tensor"]:
    """A tensor whose values (or, for is_causal, whose place) a reach may read: small, plain,
    on the CPU (`_mask_effects.readable`), strided and not nested."""
    return _small_cpu(t) and not t.is_nested and str(t.layout) == "torch.strided"


def _rows(t, queries, axis: int = -2):
    """`t` at the kept queries along `axis` (all where None, or where `t` broadcasts)."""
    import torch

    if queries is None or t.dim() < -axis or t.shape[axis] == 1:
        return t
    return t.index_select(axis, torch.tensor(queries))


def _hidden(values):
    """Where an additive value hides a key: -inf, or at or below the mask reader's
    threshold (-1e9 and finfo.min do)."""
    return values <= HIDING


# -- softmax over masked scores ----------------------------------------------------------
def _softmax(call) -> _Read | None:
    p = call.bound()
    x, dim = p.get("input"), p.get("dim")
    if not has_shape(x) or not isinstance(dim, int) or isinstance(dim, bool) or x.dim() < 2:
        return None
    if dim % x.dim() != x.dim() - 1 or not readable(x) or not x.is_floating_point():
        return None
    if not _scores(call, x):
        return None
    lead, sq, sk = tuple(int(s) for s in x.shape[:-2]), int(x.shape[-2]), int(x.shape[-1])
    queries = query_sample(lead, sq)
    import torch

    with torch.no_grad():
        visible = ~_hidden(_rows(x.detach(), queries))
    how = "unmasked" if bool(visible.all()) else "mask"
    return _Read(visible, lead, sq, sk, queries, how, _lead_axes(call, x, len(lead)))


def _scores(call, x) -> bool:
    """The last two axes of `x` are the queries and the keys by structure: a query-key
    product tagged them so, and the ops since kept the tags (`mask_semantics`' test)."""
    meta = call.meta(x)
    if meta is None:
        return False
    tags = meta.tags
    return len(tags) == x.dim() and tags[-2] == "q" and tags[-1] == "k"


def _lead_axes(call, x, count: int) -> tuple[str, ...]:
    """The names provenance gives the leading axes of `x` ("batch", "heads"; "" else)."""
    axes = call.axes(x) or ()
    names = tuple(axes[:count]) if len(axes) >= count else ()
    return tuple(n if n in _NAMED else "" for n in names) if names else ("",) * count


# -- scaled_dot_product_attention --------------------------------------------------------
def _sdpa(call) -> _Read | None:
    p = call.bound()
    q, k, mask = p.get("query"), p.get("key"), p.get("attn_mask")
    causal = p.get("is_causal") is True
    if not (readable(q) and readable(k)) or q.dim() < 2 or k.dim() < 2:
        return None  # (never meta, fake or on an accelerator, also where no value is read)
    if mask is not None and (causal or not has_shape(mask)):
        return None  # torch refuses both; an unknown mask says nothing
    lead, sq, sk = tuple(int(s) for s in q.shape[:-2]), int(q.shape[-2]), int(k.shape[-2])
    queries = query_sample(lead, sq)
    axes = _lead_axes(call, q, len(lead))
    import torch

    if causal:
        # SDPA aligns the triangle top-left: query i sees keys 0..i.
        rows = torch.tensor(queries) if queries is not None else torch.arange(sq)
        visible = torch.arange(sk)[None, :] <= rows[:, None]
        return _Read(visible, lead, sq, sk, queries, "causal", axes)
    if mask is None:
        n = len(queries) if queries is not None else sq
        return _Read(torch.ones(n, sk, dtype=torch.bool), lead, sq, sk, queries, "unmasked", axes)
    if not readable(mask) or not broadcasts_to(mask.shape, (*lead, sq, sk)):
        return None
    with torch.no_grad():
        rows = _rows(mask.detach(), queries)
        if rows.dtype == torch.bool:
            visible = rows.clone()  # True keeps
        elif rows.is_floating_point():
            visible = ~_hidden(rows)
        else:
            return None
    return _Read(visible, lead, sq, sk, queries, "mask", axes)


# -- nn.MultiheadAttention (its functional form: sequence first) ---------------------------
def _mha(call) -> _Read | None:
    p = bind_arguments(call)
    query, key, heads = p.get("query"), p.get("key"), p.get("num_heads")
    if not (readable(query) and readable(key) and isinstance(heads, int)):
        return None
    if query.dim() != 3 or key.dim() != 3 or p.get("bias_k") is not None or p.get("add_zero_attn"):
        return None  # an added key the masks do not cover
    if p.get("static_k") is not None:
        return None
    tgt, batch, src = int(query.shape[0]), int(query.shape[1]), int(key.shape[0])
    lead = (batch, heads)
    queries = query_sample(lead, tgt)
    axes = ("batch", "heads")  # the documented layout of the functional form
    import torch

    am, kpm = p.get("attn_mask"), p.get("key_padding_mask")
    if p.get("is_causal") is True and kpm is None and p.get("need_weights", True) is False:
        # torch drops attn_mask for SDPA's is_causal (top-left) here: the hint is the effect.
        rows = torch.tensor(queries) if queries is not None else torch.arange(tgt)
        visible = torch.arange(src)[None, :] <= rows[:, None]
        return _Read(visible, lead, tgt, src, queries, "causal", axes)
    masks = [m for m in (am, kpm) if m is not None]
    if not masks:
        n = len(queries) if queries is not None else tgt
        return _Read(
            torch.ones(n, src, dtype=torch.bool), lead, tgt, src, queries, "unmasked", axes
        )
    if not all(has_shape(m) and readable(m) for m in masks):
        return None
    # The readers of mask_semantics reduce both masks to `hidden` as torch combines them.
    combined = next((u for u in mask_uses(call) if u.kind == "combined"), None)
    if combined is None or combined.target != (batch, heads, tgt, src):
        return None
    with torch.no_grad():
        visible = ~_rows(combined.hidden, queries)
    return _Read(visible, lead, tgt, src, queries, "mask", axes)


# -- flash-attn's dense call (shapeguard.attention's flash_attention, flash_attn_func) --------
def _flash(call) -> _Read | None:
    from ._flash_contract import is_entry_point, is_shapeguard_entry

    spec = call.spec
    if spec.flash_form != "dense":
        return None  # varlen and packed forms: FlexAttention's and varlen's part
    if spec.flash_entry == "shapeguard" and is_shapeguard_entry(call.func):
        p = dict(call.kwargs)
        layout = p.get("layout", "bshd")
    elif spec.flash_entry == "flash_attn" and is_entry_point(call.func):
        p = _flash_arguments(call)
        layout = "bshd"
    else:
        return None
    q, k = call.args[0] if call.args else None, call.args[1] if len(call.args) > 1 else None
    if not (readable(q) and readable(k)) or q.dim() != 4 or k.dim() != 4:
        return None
    if layout not in ("bshd", "bhsd"):
        return None
    seq = 1 if layout == "bshd" else 2
    heads = 3 - seq
    batch, sq, sk = int(q.shape[0]), int(q.shape[seq]), int(k.shape[seq])
    lead = (batch, int(q.shape[heads]))
    queries = query_sample(lead, sq)
    left, right = _window(p.get("window_size", (-1, -1)))
    if p.get("causal") is True:
        right = 0
    import torch

    rows = torch.tensor(queries) if queries is not None else torch.arange(sq)
    diagonal = rows[:, None] + (sk - sq)  # flash-attn aligns to the bottom right
    keys = torch.arange(sk)[None, :]
    visible = torch.ones(len(rows), sk, dtype=torch.bool)
    how = "unmasked"
    if right >= 0:
        visible &= keys <= diagonal + right
        how = "causal" if right == 0 else "window"
    if left >= 0:
        visible &= keys >= diagonal - left
        how = "window"
    return _Read(visible, lead, sq, sk, queries, how, ("batch", "heads"))


def _window(value) -> tuple[int, int]:
    pair = isinstance(value, tuple | list) and len(value) == 2
    if pair and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return int(value[0]), int(value[1])
    return -1, -1  # unbounded, as flash-attn reads -1


def _flash_arguments(call) -> dict:
    """flash_attn_func's arguments by name (its signature: q, k, v, dropout_p,
    softmax_scale, causal, window_size, ...)."""
    import inspect

    try:
        bound = inspect.signature(call.func).bind_partial(*call.args, **call.kwargs)
    except (TypeError, ValueError):
        return {}
    return dict(bound.arguments)
