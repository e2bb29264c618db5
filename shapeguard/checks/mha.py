"""nn.MultiheadAttention / F.multi_head_attention_forward.

torch checks these with `assert` (gone under `python -O`) and names no layout;
here the shapes are given in the layout the user passed (batch_first or not).
"""

from collections.abc import Iterator

from .. import _ops
from .._errors import Operand, Violation
from .._names.dims import BATCH, TOKEN
from . import ERROR, rule
from ._view import CallView
from .config import divisibility_violation

_KINDS = {
    kind: ERROR
    for kind in (
        "head_divisibility", "mha_embed", "mha_batch", "mha_kv_seq", "mha_key_padding_mask",
        "mha_attn_mask",
    )
}  # fmt: skip


def bind_arguments(call) -> dict:
    """F.multi_head_attention_forward's arguments by name (the op table's binding)."""
    return _ops.bind(_ops.MHA, call.args, call.kwargs)


def _user_shape(t, batch_first: bool, names=("seq", "batch", "embed_dim")) -> str:
    """Shape of a (L, N, E) tensor as the user passed it."""
    shape = list(t.shape)
    if t.dim() != 3:
        return str(shape)
    (l_name, n_name, e_name), (length, n, e) = names, shape
    if batch_first:
        return f"[{n_name}={n}, {l_name}={length}, {e_name}={e}]"
    return f"[{l_name}={length}, {n_name}={n}, {e_name}={e}]"


@rule(_ops.MHA, kinds=_KINDS)
def mha_contract(call: CallView) -> Iterator[Violation]:
    """nn.MultiheadAttention's contract, in the layout the user passed."""
    p = bind_arguments(call)
    query, key, value = p.get("query"), p.get("key"), p.get("value")
    embed_dim, num_heads = p.get("embed_dim_to_check"), p.get("num_heads")
    if query is None or key is None or value is None or not isinstance(num_heads, int):
        return
    module = call.module
    batch_first = bool(getattr(module, "batch_first", False))
    layout = "batch_first=True" if batch_first else "batch_first=False"
    if isinstance(embed_dim, int) and embed_dim % num_heads:
        base = divisibility_violation("embed_dim", embed_dim, "num_heads", num_heads)
        yield Violation("head_divisibility", f"MultiheadAttention: {base.relation}", (), base.hint)
        return
    q_names = ("seq_q", "batch", "embed_dim")
    k_names = ("seq_k", "batch", "embed_dim")
    operands = (
        Operand("query", _user_shape(query, batch_first, q_names)),
        Operand("key", _user_shape(key, batch_first, k_names)),
        Operand("value", _user_shape(value, batch_first, k_names)),
    )
    if isinstance(embed_dim, int) and query.shape[-1] != embed_dim:
        yield Violation(
            "mha_embed",
            f"MultiheadAttention: query.embed_dim ({query.shape[-1]}) != embed_dim ({embed_dim})",
            operands,
            f"the module was built with embed_dim={embed_dim}; project the input to {embed_dim} "
            f"features or build MultiheadAttention({query.shape[-1]}, num_heads)",
        )
        return
    batched = query.dim() == 3
    if batched and (key.dim() != 3 or value.dim() != 3):
        return
    if batched:
        if key.shape[1] != query.shape[1] or value.shape[1] != query.shape[1]:
            yield Violation(
                "mha_batch",
                f"MultiheadAttention ({layout}): query.batch ({query.shape[1]}) != "
                f"key.batch ({key.shape[1]})",
                operands,
                _layout_hint(batch_first),
            )
            return
        if key.shape[0] != value.shape[0]:
            yield Violation(
                "mha_kv_seq",
                f"MultiheadAttention: key.seq_k ({key.shape[0]}) != value.seq_k ({value.shape[0]})",
                operands,
                "every key needs a value: key and value must have the same sequence length",
            )
            return
    bsz = query.shape[1] if batched else None
    src_len = key.shape[0]
    tgt_len = query.shape[0]
    yield from _check_key_padding_mask(
        p.get("key_padding_mask"), bsz, src_len, operands, batch_first, layout
    )
    misread = _layout_misread(call, query, batch_first)
    yield from _check_attn_mask(
        p.get("attn_mask"), bsz, num_heads, tgt_len, src_len, operands, misread or batch_first
    )


def _layout_misread(call, query, batch_first: bool) -> str | None:
    """A hint when structure shows the query is not in the layout the module reads it in:
    its batch axis (a conv's examples, by its documented layout) where batch_first=False
    reads the sequence, or its positions where it reads the batch. The query the checkers
    see is [seq, batch, embed_dim] (the module transposes a batch_first one first), and
    only the query the user passed carries what structure says; None without evidence."""
    if batch_first or query.dim() != 3:
        return None
    on_seq, on_batch = call.kind(query, 0, strong=True), call.kind(query, 1, strong=True)
    if not ((on_seq == BATCH and on_batch != BATCH) or (on_batch == TOKEN and on_seq != TOKEN)):
        return None
    label = call.label(0, "query")
    return (
        f"{label} is [batch, seq, embed_dim] (its axis 0 holds the examples): "
        f"batch_first=False reads it as [seq, batch, embed_dim], so seq_q is the batch; pass "
        f"{label}.permute(1, 0, 2) (and the same for key and value) and permute the output "
        "back, or build nn.MultiheadAttention(..., batch_first=True)"
    )


def _layout_hint(batch_first: bool) -> str:
    if batch_first:
        return "with batch_first=True pass [batch, seq, embed_dim]; were the inputs [seq, batch, embed_dim]?"
    return (
        "batch_first=False reads inputs as [seq, batch, embed_dim]; if yours are "
        "[batch, seq, embed_dim], build MultiheadAttention(..., batch_first=True)"
    )


def _check_key_padding_mask(mask, bsz, src_len, operands, batch_first, layout):
    if mask is None:
        return
    expected = (bsz, src_len) if bsz is not None else (src_len,)
    actual = tuple(mask.shape)
    if actual == expected:
        return
    hint = "key_padding_mask is [batch, seq_k], True where a key is padding"
    if bsz is not None and actual == (src_len, bsz):
        hint = (
            f"key_padding_mask is {list(actual)}, the transpose of [batch={bsz}, seq_k={src_len}]. "
            + _layout_hint(batch_first)
        )
    spelled = f"[batch={bsz}, seq_k={src_len}]" if bsz is not None else f"[seq_k={src_len}]"
    yield Violation(
        "mha_key_padding_mask",
        f"MultiheadAttention ({layout}): key_padding_mask {list(actual)} != {spelled}",
        (*operands, Operand("key_padding_mask", str(list(actual)))),
        hint,
    )


def _check_attn_mask(mask, bsz, num_heads, tgt_len, src_len, operands, layout: str | bool):
    """`layout`: the hint when the query's layout is shown wrong (`_layout_misread`),
    else the module's batch_first."""
    if mask is None:
        return
    actual = tuple(mask.shape)
    if mask.dim() == 2 and actual == (tgt_len, src_len):
        return
    if mask.dim() == 3 and bsz is not None and actual == (bsz * num_heads, tgt_len, src_len):
        return
    if mask.dim() == 3 and bsz is None and actual == (num_heads, tgt_len, src_len):
        return
    # The query's layout decides seq_q, so it comes before the mask: a mask reshaped to
    # fit a query read in the wrong layout hides the real bug. Without evidence of the
    # layout, the hint says how the module reads both, and proposes no reshaping.
    misread = layout if isinstance(layout, str) else None
    hint = misread or _reads(bool(layout), bsz is not None, tgt_len)
    if (
        misread is None
        and mask.dim() == 3
        and bsz is not None
        and actual == (bsz, tgt_len, src_len)
    ):
        hint = (
            f"a per-batch mask needs one copy per head: mask.repeat_interleave({num_heads}, dim=0)"
        )
    elif misread is None and mask.dim() == 4:
        hint = (
            "MultiheadAttention takes no 4-D mask; for padding pass key_padding_mask [batch, seq_k], "
            "for per-head masks reshape to [batch * num_heads, seq_q, seq_k]"
        )
    yield Violation(
        "mha_attn_mask",
        f"MultiheadAttention: attn_mask {list(actual)} is neither [seq_q={tgt_len}, seq_k={src_len}] "
        f"nor [batch*heads={(bsz or 1) * num_heads}, seq_q={tgt_len}, seq_k={src_len}]",
        (*operands, Operand("attn_mask", str(list(actual)))),
        hint,
    )


def _reads(batch_first: bool, batched: bool, tgt_len: int) -> str:
    if not batched:
        where = "the query is [seq, embed_dim], so seq_q is its axis 0"
    elif batch_first:
        where = (
            "batch_first=True reads the query as [batch, seq, embed_dim], so seq_q is its axis 1"
        )
    else:
        where = (
            "batch_first=False reads the query as [seq, batch, embed_dim], so seq_q is its axis 0"
        )
    return (
        f"{where} ({tgt_len}): check the query's layout first, then that attn_mask is "
        "[seq_q, seq_k] or [batch * num_heads, seq_q, seq_k]"
    )
