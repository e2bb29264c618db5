"""flash-attn's input contract, and its Python entry points wrapped while a trace is active.

The contract is flash-attn 2's (`csrc/flash_attn/flash_api.cpp`, `mha_fwd` and
`mha_varlen_fwd`; `flash_attn/flash_attn_interface.py`), restated with numbers:
the C++ checks print `k must have shape (batch_size, seqlen_k, num_heads_k,
head_size)` and no sizes, and the fake kernels used under torch.compile check
nothing. The checks read shapes, dtypes, devices and strides only, so they run
on CPU and meta tensors and never import flash_attn (its import needs the CUDA
extension). Each check yields `Violation`s; the caller decides whether to raise.

Wrapping: while a session is open, `flash_attn.flash_attn_func` and its siblings,
and every module global bound to them (`from flash_attn import flash_attn_func`),
are replaced by wrappers that route the call through the session; they are put
back when the last session closes. Nothing is wrapped unless flash_attn was
already imported by the user.
"""

import functools
import sys
import threading
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

from . import _axes
from ._errors import Context, Operand, ShapeError, ShapeWarning, Violation

# flash_api.cpp: "FlashAttention forward only supports head dimension at most 256".
MAX_HEAD_DIM = 256
# More apparent heads than any released model uses: with axes 1 and 2 both plausible, a
# [batch, heads, seq, d_k] tensor is the likelier reading (flash-attention#1812).
SUSPICIOUS_HEADS = 256
FLASH_DTYPES = ("float16", "bfloat16")
FLASH_NAMESPACES = ("flash_attn", "flashattn")  # flash-attn renamed its op namespace in 2.7
ENTRY_POINTS = (
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
)


# -- what the contract reads of a tensor -----------------------------------------------
@dataclass(frozen=True, slots=True)
class Spec:
    """One operand as the contract sees it: its name, shape, dtype, device and last stride."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "float16"
    device: str  # "cuda:0", "cpu", "meta"
    last_stride: int = 1

    @property
    def device_type(self) -> str:
        return self.device.split(":", 1)[0]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def operand(self, axes: tuple[str | None, ...] = ()) -> Operand:
        return Operand(self.name, f"{_axes.format_shape(self.shape, axes or None)} {self.dtype}")

    def part(self, name: str, drop: int) -> "Spec":
        """The spec of `t[..., i, ...]` along axis `drop` (one of q, k, v of a packed tensor)."""
        shape = self.shape[:drop] + self.shape[drop + 1 :]
        return Spec(name, shape, self.dtype, self.device, self.last_stride)


def spec(name: str, tensor) -> Spec:
    """Read what the contract needs from a tensor (no data, no torch op)."""
    shape = tuple(int(s) for s in tensor.shape)
    stride = int(tensor.stride(-1)) if shape else 1
    # A size-1 last axis is contiguous whatever its stride (torch.is_contiguous agrees).
    if shape and shape[-1] == 1:
        stride = 1
    return Spec(name, shape, str(tensor.dtype).removeprefix("torch."), str(tensor.device), stride)


def _is_tensor(value) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "stride")


# -- dense: q, k, v as [batch, seq, heads, d_k] ----------------------------------------
_LAYOUT_AXES = {
    "bshd": (("batch", "seq_q", "heads", "d_k"), ("batch", "seq_k", "kv_heads", "d_k")),
    "bhsd": (("batch", "heads", "seq_q", "d_k"), ("batch", "kv_heads", "seq_k", "d_k")),
}
_LAYOUT_TEXT = {"bshd": "[batch, seq, heads, d_k]", "bhsd": "[batch, heads, seq, d_k]"}


def _positions(layout: str) -> tuple[int, int]:
    """(seq axis, heads axis) of a 4-D tensor in `layout`."""
    return (1, 2) if layout == "bshd" else (2, 1)


def _shape_problem(q: Spec, k: Spec, v: Spec, layout: str) -> tuple[str, str, str] | None:
    """The first broken shape rule of q, k, v read in `layout`: (kind, relation, hint)."""
    s, h = _positions(layout)
    qa, ka = _LAYOUT_AXES[layout]
    for t in (k, v):
        if t.shape[0] != q.shape[0]:
            return (
                "flash_batch",
                f"{q.name}.batch ({q.shape[0]}) != {t.name}.batch ({t.shape[0]})",
                "q, k and v must come from the same batch",
            )
    if q.shape[0] == 0:
        return "flash_batch", f"{q.name}.batch is 0", "FlashAttention needs at least one sequence"
    for t in (k, v):
        if t.shape[3] != q.shape[3]:
            return (
                "flash_head_dim",
                f"{q.name}.d_k ({q.shape[3]}) != {t.name}.d_k ({t.shape[3]})",
                "flash-attn 2 takes one head size for q, k and v (a different value head size "
                "is unsupported, flash-attention#632); check the projections",
            )
    if k.shape[s] != v.shape[s]:
        return (
            "flash_kv_seq",
            f"{k.name}.{ka[s]} ({k.shape[s]}) != {v.name}.{ka[s]} ({v.shape[s]})",
            f"every key needs a value: {k.name} and {v.name} must have the same sequence length",
        )
    if k.shape[h] != v.shape[h]:
        return (
            "flash_kv_heads",
            f"{k.name}.kv_heads ({k.shape[h]}) != {v.name}.kv_heads ({v.shape[h]})",
            f"{k.name} and {v.name} must have the same number of heads",
        )
    hq, hk = q.shape[h], k.shape[h]
    if hk == 0 or hq % hk:
        counts = ", ".join(map(str, _axes.divisors(hq))) if hq else "none"
        return (
            "flash_gqa",
            f"{q.name}.{qa[h]} ({hq}) is not a multiple of {k.name}.kv_heads ({hk})",
            f"grouped-query attention shares each kv head among {q.name}.heads / "
            f"{k.name}.kv_heads query heads; kv head counts that work: {counts}",
        )
    return None


def check_dense(
    q: Spec,
    k: Spec,
    v: Spec,
    *,
    op: str,
    flash: bool,
    layout: str = "bshd",
    kernel: bool = False,
    declared_heads: tuple[str, int] | None = None,
) -> Iterator[Violation]:
    """flash_attn_func's contract for q, k, v in `layout`.

    Args:
        op: the call's name, first word of every message.
        flash: the call runs flash-attn's kernel, so its dtype, device and stride rules apply;
            False for shapeguard's SDPA fallback, where only the shape rules do.
        layout: "bshd" (flash-attn's) or "bhsd" (shapeguard.attention's `layout="bhsd"`).
        kernel: the call is the torch.ops kernel itself, which does not pad the head size.
        declared_heads: (attribute, size) the calling module declares, to spot a layout swap.
    """
    qa, ka = _LAYOUT_AXES[layout]
    operands = (q.operand(qa), k.operand(ka), v.operand(ka))
    for t in (q, k, v):
        if t.ndim != 4:
            yield Violation(
                "flash_rank",
                f"{op}: {t.name} has {t.ndim} axes; {op} takes 4: {_LAYOUT_TEXT[layout]}",
                tuple(x.operand() for x in (q, k, v)),
                _rank_hint(t, op, layout),
            )
            return
    swap = _layout_swap(q, k, v, op=op, layout=layout, declared_heads=declared_heads)
    if swap is not None:
        yield swap
        if swap.severity == "error":
            return
    problem = _shape_problem(q, k, v, layout)
    if problem is not None:
        kind, relation, hint = problem
        yield Violation(kind, f"{op}: {relation}", operands, hint)
        return
    d = q.shape[3]
    if d > MAX_HEAD_DIM:
        yield Violation(
            "flash_head_dim_max",
            f"{op}: {q.name}.d_k ({d}) > {MAX_HEAD_DIM}, the largest head size FlashAttention "
            "supports",
            operands,
            "use more heads of a smaller size, or torch's SDPA "
            "(shapeguard.attention.flash_attention(..., backend='sdpa'))",
        )
        return
    if kernel and d % 8:
        yield Violation(
            "flash_head_dim_multiple",
            f"{op}: {q.name}.d_k ({d}) is not a multiple of 8",
            operands,
            f"flash_attn_func pads the head size itself; the kernel op needs it padded: "
            f"F.pad(t, (0, {8 - d % 8})) for q, k and v, then slice the output back to {d}",
        )
        return
    yield from _dtype_device_stride((q, k, v), operands, op=op, flash=flash)


def _rank_hint(t: Spec, op: str, layout: str) -> str:
    if t.ndim == 3:
        split = ".transpose(1, 2)" if layout == "bhsd" else ""
        return (
            f"split the heads first: {t.name}.view(batch, seq, heads, d_k){split}; tokens packed "
            "over the batch ([total, heads, d_k]) go to flash_attn_varlen_func"
        )
    if t.ndim == 5:
        return (
            "a packed qkv or kv tensor goes to flash_attn_qkvpacked_func or "
            "flash_attn_kvpacked_func"
        )
    return f"{op} takes q, k and v as {_LAYOUT_TEXT[layout]}"


def _layout_swap(q, k, v, *, op, layout, declared_heads) -> Violation | None:
    """A Violation when q, k, v look laid out the other way round (axes 1 and 2 swapped)."""
    other = "bhsd" if layout == "bshd" else "bshd"
    s, h = _positions(layout)
    as_given = _shape_problem(q, k, v, layout)
    as_other = _shape_problem(q, k, v, other)
    severity = "error"
    if declared_heads is not None and q.shape[s] == declared_heads[1] != q.shape[h]:
        attr, size = declared_heads
        evidence = f"the module declares {attr}={size}, and axis {s} of {q.name} has {size} entries"
    elif as_given is not None and as_other is None:
        evidence = f"as given, {as_given[1]}; with axes 1 and 2 swapped every rule holds"
    elif as_given is None and as_other is None and q.shape[h] > SUSPICIOUS_HEADS >= q.shape[s]:
        severity = "warning"
        evidence = (
            f"{q.name} would have {q.shape[h]} heads of {q.shape[s]} positions; more than "
            f"{SUSPICIOUS_HEADS} heads is unusual"
        )
    else:
        return None
    qa, ka = _LAYOUT_AXES[layout]
    unique = list(dict.fromkeys(t.name for t in (q, k, v)))
    fix = ", ".join(f"{name}.transpose(1, 2)" for name in unique)
    if op == "flash_attention":  # shapeguard's entry point takes either layout
        hint = f"{evidence}. Pass layout='{other}' (the output comes back the same way), or {fix}"
    else:
        hint = (
            f"{evidence}. Pass {fix} and transpose the output back, or call "
            "shapeguard.attention.flash_attention(..., layout='bhsd')"
        )
    names = ", ".join(unique)
    return Violation(
        "layout_bshd" if layout == "bshd" else "layout_bhsd",
        f"{op}: {names} look like {_LAYOUT_TEXT[other]}; {op} takes {_LAYOUT_TEXT[layout]}",
        (q.operand(qa), k.operand(ka), v.operand(ka)),
        hint,
        severity=severity,
    )


def _dtype_device_stride(tensors, operands, *, op: str, flash: bool) -> Iterator[Violation]:
    first = tensors[0]
    for t in tensors[1:]:
        if t.dtype != first.dtype:
            yield Violation(
                "flash_dtype_mismatch",
                f"{op}: {first.name} is {first.dtype} but {t.name} is {t.dtype}",
                operands,
                f"q, k and v must share one dtype: {t.name}.to({first.name}.dtype)",
            )
            return
    for t in tensors[1:]:
        if t.device != first.device:
            yield Violation(
                "flash_device_mismatch",
                f"{op}: {first.name} is on {first.device} but {t.name} is on {t.device}",
                operands,
                f"q, k and v must be on one device: {t.name}.to({first.name}.device)",
            )
            return
    if not flash:
        return
    if first.dtype not in FLASH_DTYPES:
        yield Violation(
            "flash_dtype",
            f"{op}: {first.name} is {first.dtype}; FlashAttention takes float16 or bfloat16 only",
            operands,
            f"cast before the call ({first.name}.to(torch.bfloat16)) or run under "
            "torch.autocast('cuda', dtype=torch.bfloat16); if the model is half precision, look "
            "upstream for a module that upcast to float32 (a LayerNorm kept in float32 is the "
            "usual one)",
        )
        return
    # The meta device stands in for any device: shapes are checked, placement is not.
    if first.device_type not in ("cuda", "meta"):
        yield Violation(
            "flash_device",
            f"{op}: {first.name} is on {first.device}; FlashAttention runs on CUDA only",
            operands,
            "move q, k and v with .cuda(), or call shapeguard.attention.flash_attention, "
            "which runs torch's SDPA off the GPU",
        )
        return
    for t in tensors:
        if t.last_stride != 1:
            yield Violation(
                "flash_stride",
                f"{op}: {t.name}'s last axis has stride {t.last_stride}, not 1",
                operands,
                f"flash-attn copies {t.name} to make its last axis contiguous before the kernel, "
                f"on every call; if {t.name} came from a transpose of its last axis, check that it "
                "is the tensor you mean",
                severity="warning",
            )
            return


# -- packed variants ---------------------------------------------------------------------
def check_qkvpacked(qkv: Spec, *, op: str, flash: bool, declared_heads=None):
    """flash_attn_qkvpacked_func: qkv is [batch, seq, 3, heads, d_k]."""
    if qkv.ndim != 5 or qkv.shape[2] != 3:
        yield Violation(
            "flash_packed",
            f"{op}: {qkv.name} {list(qkv.shape)} is not [batch, seq, 3, heads, d_k]",
            (qkv.operand(),),
            "stack q, k and v on axis 2: torch.stack([q, k, v], dim=2) with each "
            "[batch, seq, heads, d_k]",
        )
        return
    q, k, v = (qkv.part(f"{qkv.name}[:, :, {i}]", 2) for i in range(3))
    yield from check_dense(q, k, v, op=op, flash=flash, declared_heads=declared_heads)


def check_kvpacked(q: Spec, kv: Spec, *, op: str, flash: bool, declared_heads=None):
    """flash_attn_kvpacked_func: q [batch, seq_q, heads, d_k], kv [batch, seq_k, 2, heads, d_k]."""
    if kv.ndim != 5 or kv.shape[2] != 2:
        yield Violation(
            "flash_packed",
            f"{op}: {kv.name} {list(kv.shape)} is not [batch, seq_k, 2, kv_heads, d_k]",
            (q.operand(), kv.operand()),
            "stack k and v on axis 2: torch.stack([k, v], dim=2) with each "
            "[batch, seq_k, kv_heads, d_k]",
        )
        return
    k, v = (kv.part(f"{kv.name}[:, :, {i}]", 2) for i in range(2))
    yield from check_dense(q, k, v, op=op, flash=flash, declared_heads=declared_heads)


# -- varlen: tokens of all sequences packed, [total, heads, d_k] ----------------------------
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
    specs = [spec(n, t) for n, t in zip(names[:3], (q, k, v), strict=True)]
    return check_varlen(
        *specs,
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
    d = q.shape[-1]
    if d > MAX_HEAD_DIM:
        yield Violation(
            "flash_head_dim_max",
            f"{op}: {q.name}.d_k ({d}) > {MAX_HEAD_DIM}, the largest head size FlashAttention "
            "supports",
            operands,
            "use more heads of a smaller size",
        )
        return
    if kernel and d % 8:
        yield Violation(
            "flash_head_dim_multiple",
            f"{op}: {q.name}.d_k ({d}) is not a multiple of 8",
            operands,
            f"flash_attn_varlen_func pads the head size itself; the kernel op needs it padded: "
            f"F.pad(t, (0, {8 - d % 8})) for q, k and v",
        )
        return
    for cu, t, axis in ((cu_q, q, "total_q"), (cu_k, None if paged else k, "total_k")):
        found = next(_check_cu_values(cu, t, axis, op=op), None)
        if found is not None:
            yield found
            return
    found_all = list(_dtype_device_stride((q, k, v), operands, op=op, flash=flash))
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
    if qkv.ndim != 4 or qkv.shape[1] != 3:
        yield Violation(
            "flash_packed",
            f"{op}: {qkv.name} {list(qkv.shape)} is not [total, 3, heads, d_k]",
            (qkv.operand(),),
            "stack q, k and v on axis 1: torch.stack([q, k, v], dim=1) with each "
            "[total, heads, d_k]",
        )
        return
    q, k, v = (qkv.part(f"{qkv.name}[:, {i}]", 1) for i in range(3))
    yield from check_varlen(q, k, v, cu, cu, op=op, flash=flash)


def check_varlen_kvpacked(q: Spec, kv: Spec, cu_q: CuSeqlens, cu_k: CuSeqlens, *, op, flash):
    """flash_attn_varlen_kvpacked_func: q [total_q, heads, d_k], kv [total_k, 2, kv_heads, d_k]."""
    if kv.ndim != 4 or kv.shape[1] != 2:
        yield Violation(
            "flash_packed",
            f"{op}: {kv.name} {list(kv.shape)} is not [total_k, 2, kv_heads, d_k]",
            (q.operand(), kv.operand()),
            "stack k and v on axis 1: torch.stack([k, v], dim=1) with each "
            "[total_k, kv_heads, d_k]",
        )
        return
    k, v = (kv.part(f"{kv.name}[:, {i}]", 1) for i in range(2))
    yield from check_varlen(q, k, v, cu_q, cu_k, op=op, flash=flash)


# -- outside a trace: raise or warn at the user's line ------------------------------------
def enforce(violations, *, op: str, site) -> None:
    """Raise the first error (and warn for warnings before it), in the house format."""
    __tracebackhide__ = True
    for violation in violations:
        violation.op = violation.op or op
        context = Context(
            location=site.location if site else "", source=site.source if site else ""
        )
        error = ShapeError.from_violation(violation, context)
        if violation.severity == "error":
            raise error
        warnings.warn_explicit(
            ShapeWarning(error.render(), kind=violation.kind, hint=violation.hint),
            ShapeWarning,
            site.filename if site else "<shapeguard>",
            site.lineno if site else 0,
        )


def site_label(site, op: str, index: int, default: str) -> str:
    """The user's expression for positional argument `index` of a call to `op`, else `default`."""
    from ._source import short_label

    if site is None or site.in_module or site.callee != op or index >= len(site.args):
        return default
    return short_label(site.args[index])


def import_hint(name: str) -> str | None:
    """What to import instead of a name flash_attn does not have (for `shapeguard explain`)."""
    if name in ENTRY_POINTS or name == "flash_attn_with_kvcache":
        return None
    return (
        f"flash_attn has no `{name}`: use `from flash_attn import flash_attn_func` "
        "(q, k, v as [batch, seq, heads, head_dim], float16/bfloat16, CUDA), or "
        "`from shapeguard.attention import flash_attention`, which checks the inputs and runs "
        "torch's SDPA where flash-attn cannot run"
    )


# -- wrapping flash-attn's Python entry points while a trace is active ---------------------
_lock = threading.RLock()
_depth = 0
_bindings: list[tuple[dict, str, object, object]] = []  # (module dict, name, original, wrapper)
_originals: dict[int, object] = {}  # id -> original function, while wrapped
# Where the originals were bound at the last scan of sys.modules, and what that scan saw.
# Scanning every module's globals costs about a millisecond, and a guarded module opens a
# session on every forward: scan again only when a module was imported or flash_attn changed.
_scan_key: tuple = ()
_locations: list[tuple[dict, str]] = []


def is_entry_point(func) -> bool:
    """Whether `func` is a flash-attn entry point wrapped by the open trace."""
    return _originals.get(id(func)) is func


def is_kernel_op(func) -> bool:
    """Whether `func` is one of flash-attn's torch.ops kernels (any overload)."""
    qualified = getattr(func, "_qualified_op_name", None) or getattr(func, "_name", "")
    namespace = getattr(func, "namespace", None) or str(qualified).split("::", 1)[0]
    return namespace in FLASH_NAMESPACES


def patch() -> bool:
    """Wrap flash-attn's entry points for a session that is opening. Never raises.

    Returns True: the caller holds one reference and must pass it to `restore`.
    """
    global _depth
    with _lock:
        _depth += 1
        if _depth == 1:
            try:
                _install()
            except Exception:  # a broken module must not stop the trace from opening
                _uninstall()
        return True


def restore(held: bool) -> None:
    """Release one reference from `patch`; the last one puts every original back. Never raises."""
    global _depth
    if not held:
        return
    with _lock:
        _depth = max(0, _depth - 1)
        if _depth == 0:
            _uninstall()


def _install() -> None:
    global _scan_key
    module = sys.modules.get("flash_attn")
    if module is None:  # never import it: it needs its CUDA extension
        return
    found = {}
    for name in ENTRY_POINTS:
        func = vars(module).get(name)
        if callable(func) and not hasattr(func, "__shapeguard_original__"):
            found[id(func)] = func
    if not found:
        return
    _originals.update(found)
    key = (len(sys.modules), frozenset(found))
    if key != _scan_key:
        _locations[:] = _scan(found)
        _scan_key = key
    wrappers: dict[int, object] = {}
    for namespace, name in _locations:
        value = namespace.get(name)
        original = found.get(id(value))
        if original is None or value is not original:
            continue
        wrapper = wrappers.get(id(original))
        if wrapper is None:
            wrapper = wrappers[id(original)] = _wrap(original)
        namespace[name] = wrapper
        _bindings.append((namespace, name, original, wrapper))


def _scan(found: dict[int, object]) -> list[tuple[dict, str]]:
    """Every (module globals, name) bound to one of the `found` functions."""
    locations = []
    for mod in list(sys.modules.values()):
        if isinstance(mod, types.ModuleType):
            namespace = vars(mod)
            locations += [
                (namespace, name)
                for name, value in list(namespace.items())
                if id(value) in found and found[id(value)] is value
            ]
    return locations


def _uninstall() -> None:
    bindings, _bindings[:] = list(_bindings), []
    for namespace, key, original, wrapper in reversed(bindings):
        try:
            if namespace.get(key) is wrapper:  # leave a name the user rebound meanwhile
                namespace[key] = original
        except Exception:
            continue
    _originals.clear()


def _wrap(original):
    @functools.wraps(original)
    def checked(*args, **kwargs):
        __tracebackhide__ = True
        from ._session import current_session

        session = current_session()
        if session is None:  # another thread, or called after the trace closed
            return original(*args, **kwargs)
        # The session checks the call against the contract (checks/flash.py), runs it with
        # the interceptor quiet, and records one event named after the original.
        return session.dispatch(original, args, kwargs)

    checked.__shapeguard_original__ = original
    return checked
