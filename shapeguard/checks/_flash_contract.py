"""flash-attn's input contract for dense q, k, v (`flash_attn_func` and its packed
variants), and how a broken contract is raised outside a trace.

The contract is flash-attn 2's (`csrc/flash_attn/flash_api.cpp`, `mha_fwd`;
`flash_attn/flash_attn_interface.py`), restated with numbers: the C++ checks print
`k must have shape (batch_size, seqlen_k, num_heads_k, head_size)` and no sizes, and
the fake kernels used under torch.compile check nothing. The checks read shapes,
dtypes, devices and strides only, so they run on CPU and meta tensors and never
import flash_attn (its import needs the CUDA extension). Each check yields
`Violation`s; the caller decides whether to raise. The varlen contract is in
`_flash_varlen`.
"""

from collections.abc import Iterator
from dataclasses import dataclass

from .. import _ops, _reporting
from .._errors import Context, Operand, ShapeError, Violation
from .._names import axes as _axes
from .._values import dtype_name
from . import ERROR, WARNING, Severities

# Every kind flash-attn's contract reports (the entry points, the kernels, varlen).
KINDS: dict[str, Severities] = {
    **dict.fromkeys(
        (
            "flash_batch", "flash_cu_seqlens_dtype", "flash_cu_seqlens_order",
            "flash_cu_seqlens_shape", "flash_cu_seqlens_total", "flash_device",
            "flash_device_mismatch", "flash_dtype", "flash_dtype_mismatch", "flash_gqa",
            "flash_head_dim", "flash_head_dim_max", "flash_head_dim_multiple",
            "flash_kv_heads", "flash_kv_seq", "flash_max_seqlen", "flash_packed",
            "flash_rank",
        ),
        ERROR,
    ),
    "flash_stride": WARNING,
    # A layout swap is an error when the shapes prove it, a warning when only likely.
    "layout_bshd": (ERROR, WARNING),
    "layout_bhsd": (ERROR, WARNING),
}  # fmt: skip
# Declared by the flash rule that yields them (checks/flash.py).

# flash_api.cpp: "FlashAttention forward only supports head dimension at most 256".
MAX_HEAD_DIM = 256
# More apparent heads than any released model uses: with axes 1 and 2 both plausible, a
# [batch, heads, seq, d_k] tensor is the likelier reading (flash-attention#1812).
SUSPICIOUS_HEADS = 256
FLASH_DTYPES = ("float16", "bfloat16")
FLASH_NAMESPACES = ("flash_attn", "flashattn")  # flash-attn renamed its op namespace in 2.7
ENTRY_POINTS = _ops.FLASH_ENTRY_POINTS

# -- which functions are flash-attn's (the flash rule checks these and nothing else) ---
# id -> the original of each entry point the open trace has wrapped (filled by `_trace.flash`).
WRAPPED: dict[int, object] = {}


def is_entry_point(func) -> bool:
    """Whether `func` is a flash-attn entry point wrapped by the open trace."""
    return WRAPPED.get(id(func)) is func


def is_kernel_op(func) -> bool:
    """Whether `func` is one of flash-attn's torch.ops kernels (any overload)."""
    qualified = getattr(func, "_qualified_op_name", None) or getattr(func, "_name", "")
    namespace = getattr(func, "namespace", None) or str(qualified).split("::", 1)[0]
    return namespace in FLASH_NAMESPACES


def is_shapeguard_entry(func) -> bool:
    """Whether `func` is shapeguard.attention's own kernel call (marked where defined)."""
    return getattr(func, "__shapeguard_flash_entry__", False) is True


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
    return Spec(name, shape, dtype_name(tensor.dtype), str(tensor.device), stride)


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
    found = head_size_problem(q, operands, op=op, kernel=kernel)
    if found is not None:
        yield found
        return
    yield from dtype_device_stride((q, k, v), operands, op=op, flash=flash)


def head_size_problem(
    q: Spec, operands, *, op: str, kernel: bool, varlen: bool = False
) -> Violation | None:
    """FlashAttention's head size rules: at most MAX_HEAD_DIM, and a multiple of 8 for the
    kernel op itself (flash_attn_func and flash_attn_varlen_func pad it)."""
    d = q.shape[-1]
    entry, sdpa, back = (
        ("flash_attn_varlen_func", "", "")
        if varlen
        else (
            "flash_attn_func",
            ", or torch's SDPA (shapeguard.attention.flash_attention(..., backend='sdpa'))",
            f", then slice the output back to {d}",
        )
    )
    if d > MAX_HEAD_DIM:
        return Violation(
            "flash_head_dim_max",
            f"{op}: {q.name}.d_k ({d}) > {MAX_HEAD_DIM}, the largest head size FlashAttention "
            "supports",
            operands,
            f"use more heads of a smaller size{sdpa}",
        )
    if kernel and d % 8:
        return Violation(
            "flash_head_dim_multiple",
            f"{op}: {q.name}.d_k ({d}) is not a multiple of 8",
            operands,
            f"{entry} pads the head size itself; the kernel op needs it padded: "
            f"F.pad(t, (0, {8 - d % 8})) for q, k and v{back}",
        )
    return None


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


def dtype_device_stride(tensors, operands, *, op: str, flash: bool) -> Iterator[Violation]:
    """One dtype and one device for all; with `flash`, float16/bfloat16 on CUDA (or meta),
    and a contiguous last axis (a warning: flash-attn copies to make it so)."""
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
def unpacked(packed: Spec, each: tuple[str, ...], axis: int, *, op: str, before=()):
    """The specs of q, k and v (of k and v when `before` holds q) stacked on `axis` of
    `packed`, each laid out as `each`; None, after yielding a flash_packed Violation, when
    `packed` is not such a stack. Use as `parts = yield from unpacked(...)`."""
    count = 2 if before else 3
    names, listed = ("k and v", "k, v") if before else ("q, k and v", "q, k, v")
    if packed.ndim != len(each) + 1 or packed.shape[axis] != count:
        stacked = [*each[:axis], str(count), *each[axis:]]
        yield Violation(
            "flash_packed",
            f"{op}: {packed.name} {list(packed.shape)} is not [{', '.join(stacked)}]",
            (*(t.operand() for t in before), packed.operand()),
            f"stack {names} on axis {axis}: torch.stack([{listed}], dim={axis}) with each "
            f"[{', '.join(each)}]",
        )
        return None
    return [packed.part(f"{packed.name}[{':, ' * axis}{i}]", axis) for i in range(count)]


def check_qkvpacked(qkv: Spec, *, op: str, flash: bool, declared_heads=None):
    """flash_attn_qkvpacked_func: qkv is [batch, seq, 3, heads, d_k]."""
    parts = yield from unpacked(qkv, ("batch", "seq", "heads", "d_k"), 2, op=op)
    if parts:
        yield from check_dense(*parts, op=op, flash=flash, declared_heads=declared_heads)


def check_kvpacked(q: Spec, kv: Spec, *, op: str, flash: bool, declared_heads=None):
    """flash_attn_kvpacked_func: q [batch, seq_q, heads, d_k], kv [batch, seq_k, 2, heads, d_k]."""
    parts = yield from unpacked(kv, ("batch", "seq_k", "kv_heads", "d_k"), 2, op=op, before=(q,))
    if parts:
        yield from check_dense(q, *parts, op=op, flash=flash, declared_heads=declared_heads)


# -- outside a trace: raise or warn at the user's line ------------------------------------
def enforce(violations, *, op: str, site) -> None:
    """Raise the first error (and warn for warnings before it), in the house format."""
    __tracebackhide__ = True
    for violation in violations:
        violation.op = violation.op or op
        context = Context(
            location=site.location if site else "", source=site.source if site else ""
        )
        _reporting.deliver(
            ShapeError.from_violation(violation, context),
            violation.severity,
            mode="raise",
            filename=site.filename if site else "<shapeguard>",
            lineno=site.lineno if site else 0,
        )


def site_label(site, op: str, index: int, default: str) -> str:
    """The user's expression for positional argument `index` of a call to `op`, else `default`."""
    from .._source import short_label

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
