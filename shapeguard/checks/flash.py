"""flash-attn's contract for the calls a trace sees.

Three kinds of call reach this family, each by the name the session gives it:
- `flash_attention` / `flash_attention_varlen`: shapeguard.attention's entry points;
- `flash_attn_func` and its siblings: flash-attn's Python functions, wrapped while a trace
  is active (shapeguard/_trace/flash.py), so the contract is checked in the user's names;
- `_flash_attn_forward[.default]`, `_flash_attn_varlen_forward[.default]`: the torch.ops
  kernels, reached by code that holds the op itself; their fake kernels check nothing.
A function of the same name from elsewhere is left alone: each checker first makes
sure the call is flash-attn's (or shapeguard's).
"""

import inspect
from collections.abc import Iterator

from .. import _ops
from .._errors import Violation
from .._memo import Memo
from .._values import is_tensor
from . import _flash_contract, _flash_varlen, rule
from ._view import CallView


@rule(*(op for op in _ops.ALL if op.family == _ops.FLASH), kinds=_flash_contract.KINDS)
def flash_contract(call: CallView) -> Iterator[Violation]:
    spec = call.spec
    if spec.flash_entry in ("torch", "xformers"):
        return  # torch's varlen_attn: checks/flex.py reads it; xformers': checks/xformers.py
    if spec.flash_entry == "kernel":
        if not _flash_contract.is_kernel_op(call.func):
            return
        yield from _check(call, f"torch.ops.flash_attn.{spec.name}", call.bound(), spec.params)
        return
    if spec.flash_entry == "shapeguard":
        if not _flash_contract.is_shapeguard_entry(call.func):
            return
    elif not _flash_contract.is_entry_point(call.func):
        return
    order = _parameters(call.func)
    params = dict(zip(order, call.args, strict=False))
    params.update(call.kwargs)
    yield from _check(call, spec.name, params, order)


def _check(call, shown: str, p: dict, order: tuple[str, ...]):
    def spec(param: str):
        value = p.get(param)
        if not is_tensor(value):
            return None
        index = order.index(param) if param in order else len(call.args)
        positional = index < len(call.args)
        label = call.label(index, param) if positional else call.label_of(value, param)
        return _flash_contract.spec(label, value)

    declared = call.declared().get("heads")
    flash = p.get("path", "flash") == "flash"
    kernel = call.spec.flash_entry == "kernel"
    form = call.spec.flash_form
    if form == "dense":
        q, k, v = spec("q"), spec("k"), spec("v")
        if q and k and v:
            yield from _flash_contract.check_dense(
                q, k, v, op=shown, flash=flash, layout=p.get("layout", "bshd"), kernel=kernel,
                declared_heads=declared,
            )  # fmt: skip
    elif form == "qkvpacked":
        qkv = spec("qkv")
        if qkv:
            yield from _flash_contract.check_qkvpacked(
                qkv, op=shown, flash=flash, declared_heads=declared
            )
    elif form == "kvpacked":
        q, kv = spec("q"), spec("kv")
        if q and kv:
            yield from _flash_contract.check_kvpacked(
                q, kv, op=shown, flash=flash, declared_heads=declared
            )
    elif form == "varlen":
        yield from _varlen(shown, p, spec, flash=flash, kernel=kernel)
    elif form == "varlen_qkvpacked":
        qkv, cu = spec("qkv"), spec("cu_seqlens")
        if qkv and cu:
            cu = _cu(p, cu, "cu_seqlens", "max_seqlen")
            yield from _flash_varlen.check_varlen_qkvpacked(qkv, cu, op=shown, flash=flash)
    elif form == "varlen_kvpacked":
        q, kv, cu_q, cu_k = spec("q"), spec("kv"), spec("cu_seqlens_q"), spec("cu_seqlens_k")
        if q and kv and cu_q and cu_k:
            cu_q = _cu(p, cu_q, "cu_seqlens_q", "max_seqlen_q")
            cu_k = _cu(p, cu_k, "cu_seqlens_k", "max_seqlen_k")
            yield from _flash_varlen.check_varlen_kvpacked(q, kv, cu_q, cu_k, op=shown, flash=flash)


def _cu(p: dict, cu, param: str, max_param: str):
    return _flash_varlen.cu_seqlens(cu.name, p[param], p.get(max_param), max_param)


def _varlen(shown, p, spec, *, flash: bool, kernel: bool):
    names = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")
    specs = [spec(n) for n in names]
    if not all(specs):
        return
    args = tuple(p[n] for n in names) + (p.get("max_seqlen_q"), p.get("max_seqlen_k"))
    yield from _flash_varlen.check_varlen_args(
        [s.name for s in specs], args, op=shown, flash=flash, kernel=kernel,
        paged=p.get("block_table") is not None,
    )  # fmt: skip


# By flash-attn function: a dozen entry points, and the wrappers a trace makes of them.
_PARAMETERS = Memo("flash parameters", 256)


def _parameters(func) -> tuple[str, ...]:
    found = _PARAMETERS.get(func)
    if found is None:
        try:
            found = tuple(inspect.signature(func).parameters)
        except (TypeError, ValueError):
            found = ()
        _PARAMETERS.put(func, found)
    return found
