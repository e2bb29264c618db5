"""flash-attn's varlen contract (`flash_attn_varlen_func` and its packed variants): the
tokens of every sequence packed as [total, heads, d_k], delimited by cu_seqlens.

flash-attn 2's `mha_varlen_fwd` (`csrc/flash_attn/flash_api.cpp`) restated with numbers,
as `_flash_contract` does for the dense functions, whose dtype, device, stride and head
size rules apply here too. cu_seqlens values are read off the meta device only.
"""

from collections.abc import Iterator
from dataclasses import dataclass

from . import _axes
from ._errors import Violation
from ._flash_contract import Spec, dtype_device_stride, head_size_problem, spec, unpacked


@dataclass(frozen=True, slots=True)
class CuSeqlens:
    """A cu_seqlens argument: its spec, its values when they can be read, its max_seqlen."""

    spec: Spec
    values: tuple[int, ...] | None  # None on the meta device
    max_seqlen: object  # as passed; checked when it is an int
    max_name: str


def cu_seqlens(name: str, tensor, max_seqlen, max_name: str) -> CuSeqlens:
    """Read a cu_seqlens tensor: its values only off the meta device (a sync on CUDA)."""
    s = spec(name, tensor)
    values = None
    if s.device_type != "meta" and s.ndim == 1:
        values = tuple(int(x) for x in tensor.tolist())
    return CuSeqlens(s, values, max_seqlen, max_name)


def check_varlen_args(names, args, *, op: str, flash: bool, kernel: bool = False, paged=False):
    """The varlen contract for (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    named `names[:5]`."""
    q, k, v, cu_q, cu_k, max_q, max_k = args
    sq, sk, sv = (spec(n, t) for n, t in zip(names[:3], (q, k, v), strict=True))
    return check_varlen(
        sq,
        sk,
        sv,
        cu_seqlens(names[3], cu_q, max_q, "max_seqlen_q"),
        cu_seqlens(names[4], cu_k, max_k, "max_seqlen_k"),
        op=op,
        flash=flash,
        kernel=kernel,
        paged=paged,
    )


_VARLEN_AXES = (("total_q", "heads", "d_k"), ("total_k", "kv_heads", "d_k"))


def check_varlen(
    q: Spec,
    k: Spec,
    v: Spec,
    cu_q: CuSeqlens,
    cu_k: CuSeqlens,
    *,
    op: str,
    flash: bool,
    kernel: bool = False,
    paged: bool = False,
) -> Iterator[Violation]:
    """flash_attn_varlen_func's contract: packed tokens, cu_seqlens int32 [batch + 1],
    non-decreasing from 0 to the token count, max_seqlen no shorter than any sequence.

    `paged`: k and v are a paged KV cache (block_table given); their token counts are not
    checked against cu_seqlens_k.
    """
    qa, ka = _VARLEN_AXES
    operands = (q.operand(qa), k.operand(ka), v.operand(ka))
    want = 4 if paged else 3
    for t, n in ((q, 3), (k, want), (v, want)):
        if t.ndim != n:
            hint = (
                f"{op} takes tokens packed over the batch; unpad a [batch, seq, heads, d_k] "
                "batch with flash_attn.bert_padding.unpad_input, or call flash_attn_func"
                if t.ndim == 4
                else f"{op} takes q as [total_q, heads, d_k] and k, v as [total_k, kv_heads, d_k]"
            )
            yield Violation(
                "flash_rank",
                f"{op}: {t.name} has {t.ndim} axes; {op} takes {n}: "
                + ("[total, heads, d_k]" if n == 3 else "[blocks, block_size, kv_heads, d_k]"),
                tuple(x.operand() for x in (q, k, v)),
                hint,
            )
            return
    found = next(_check_cu_format(cu_q, cu_k, op=op), None)
    if found is not None:
        yield found
        return
    problem = _varlen_shape_problem(q, k, v, paged)
    if problem is not None:
        kind, relation, hint = problem
        yield Violation(kind, f"{op}: {relation}", operands, hint)
        return
    found = head_size_problem(q, operands, op=op, kernel=kernel, varlen=True)
    if found is not None:
        yield found
        return
    packed: Spec | None  # k is not checked against cu_seqlens_k when paged
    for cu, packed, axis in ((cu_q, q, "total_q"), (cu_k, None if paged else k, "total_k")):
        found = next(_check_cu_values(cu, packed, axis, op=op), None)
        if found is not None:
            yield found
            return
    found_all = list(dtype_device_stride((q, k, v), operands, op=op, flash=flash))
    yield from found_all
    if any(f.severity == "error" for f in found_all):
        return
    for cu in (cu_q, cu_k):
        if q.device_type != "meta" and cu.spec.device != q.device:
            yield Violation(
                "flash_device_mismatch",
                f"{op}: {cu.spec.name} is on {cu.spec.device} but {q.name} is on {q.device}",
                (cu.spec.operand(("batch+1",)), q.operand(qa)),
                f"cu_seqlens live with the tokens: {cu.spec.name}.to({q.name}.device)",
            )
            return


def _varlen_shape_problem(q: Spec, k: Spec, v: Spec, paged: bool):
    if k.shape[-1] != q.shape[-1] or v.shape[-1] != q.shape[-1]:
        t = k if k.shape[-1] != q.shape[-1] else v
        return (
            "flash_head_dim",
            f"{q.name}.d_k ({q.shape[-1]}) != {t.name}.d_k ({t.shape[-1]})",
            "flash-attn 2 takes one head size for q, k and v; check the projections",
        )
    if k.shape[:-2] != v.shape[:-2]:
        axis = "total_k" if not paged else "blocks"
        return (
            "flash_kv_seq",
            f"{k.name}.{axis} ({k.shape[0]}) != {v.name}.{axis} ({v.shape[0]})",
            f"every key needs a value: {k.name} and {v.name} must hold the same tokens",
        )
    hq, hk, hv = q.shape[-2], k.shape[-2], v.shape[-2]
    if hk != hv:
        return (
            "flash_kv_heads",
            f"{k.name}.kv_heads ({hk}) != {v.name}.kv_heads ({hv})",
            f"{k.name} and {v.name} must have the same number of heads",
        )
    if hk == 0 or hq % hk:
        return (
            "flash_gqa",
            f"{q.name}.heads ({hq}) is not a multiple of {k.name}.kv_heads ({hk})",
            f"grouped-query attention shares each kv head among {q.name}.heads / "
            f"{k.name}.kv_heads query heads; kv head counts that work: "
            + ", ".join(map(str, _axes.divisors(hq))),
        )
    return None


def _check_cu_format(cu_q: CuSeqlens, cu_k: CuSeqlens, *, op: str) -> Iterator[Violation]:
    for cu in (cu_q, cu_k):
        s = cu.spec
        if s.dtype != "int32":
            yield Violation(
                "flash_cu_seqlens_dtype",
                f"{op}: {s.name} is {s.dtype}; cu_seqlens must be int32",
                (s.operand(),),
                f"{s.name}.to(torch.int32) (torch.cumsum returns int64)",
            )
            return
        if s.ndim != 1 or s.shape[0] < 2:
            yield Violation(
                "flash_cu_seqlens_shape",
                f"{op}: {s.name} {list(s.shape)} is not [batch + 1] with batch >= 1",
                (s.operand(),),
                "cu_seqlens holds the running total of the sequence lengths, starting at 0: "
                "F.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))",
            )
            return
    a, b = cu_q.spec, cu_k.spec
    if a.shape != b.shape:
        yield Violation(
            "flash_cu_seqlens_shape",
            f"{op}: {a.name} has {a.shape[0]} entries but {b.name} has {b.shape[0]}; "
            "both are [batch + 1]",
            (a.operand(("batch+1",)), b.operand(("batch+1",))),
            "q and k must describe the same batch of sequences",
        )


def _check_cu_values(
    cu: CuSeqlens, tokens: Spec | None, axis: str, *, op: str
) -> Iterator[Violation]:
    """Values of one cu_seqlens against its token count and its max_seqlen (skipped on meta)."""
    values, s = cu.values, cu.spec
    if values is None:
        return
    operands = (s.operand(("batch+1",)),) + ((tokens.operand(),) if tokens is not None else ())
    if values[0] != 0:
        yield Violation(
            "flash_cu_seqlens_order",
            f"{op}: {s.name}[0] is {values[0]}, not 0",
            operands,
            "cu_seqlens is the running total of the sequence lengths, starting at 0: "
            "F.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))",
        )
        return
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            yield Violation(
                "flash_cu_seqlens_order",
                f"{op}: {s.name} decreases at index {i}: {s.name}[{i}] ({values[i]}) < "
                f"{s.name}[{i - 1}] ({values[i - 1]})",
                operands,
                "cu_seqlens is a running total of sequence lengths, so it never decreases; "
                "pass lengths through .cumsum(0) once, not twice or not at all",
            )
            return
    if tokens is not None and values[-1] != tokens.shape[0]:
        yield Violation(
            "flash_cu_seqlens_total",
            f"{op}: {s.name}[-1] ({values[-1]}) != {tokens.name}.{axis} ({tokens.shape[0]})",
            operands,
            f"the last running total is the number of packed tokens, and {tokens.name} holds "
            f"{tokens.shape[0]}",
        )
        return
    longest = max(b - a for a, b in zip(values, values[1:], strict=False))
    m = cu.max_seqlen
    if isinstance(m, int) and not isinstance(m, bool) and m < longest:
        which = max(range(len(values) - 1), key=lambda i: values[i + 1] - values[i])
        yield Violation(
            "flash_max_seqlen",
            f"{op}: {cu.max_name} ({m}) < the longest sequence in {s.name} "
            f"({longest}, sequence {which})",
            operands,
            f"pass {cu.max_name}={longest}: the kernel sizes its grid from {cu.max_name}, so "
            "positions past it are never computed",
        )


def check_varlen_qkvpacked(qkv: Spec, cu: CuSeqlens, *, op: str, flash: bool):
    """flash_attn_varlen_qkvpacked_func: qkv is [total, 3, heads, d_k]."""
    parts = yield from unpacked(qkv, ("total", "heads", "d_k"), 1, op=op)
    if parts:
        q, k, v = parts
        yield from check_varlen(q, k, v, cu, cu, op=op, flash=flash)


def check_varlen_kvpacked(q: Spec, kv: Spec, cu_q: CuSeqlens, cu_k: CuSeqlens, *, op, flash):
    """flash_attn_varlen_kvpacked_func: q [total_q, heads, d_k], kv [total_k, 2, kv_heads, d_k]."""
    parts = yield from unpacked(kv, ("total_k", "kv_heads", "d_k"), 1, op=op, before=(q,))
    if parts:
        k, v = parts
        yield from check_varlen(q, k, v, cu_q, cu_k, op=op, flash=flash)
