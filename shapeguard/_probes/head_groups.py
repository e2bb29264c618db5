"""An attention layer's projections as blocks of head rows, for permuting its heads."""

from dataclasses import dataclass
from typing import Any

import torch

from .. import _axes
from .watch import Watch


@dataclass(slots=True)
class Rows:
    """A block of a parameter along one axis that holds `heads` heads of `d_k` each."""

    param: str  # parameter name in the model
    axis: int
    offset: int
    heads: int
    d_k: int
    kv: bool = False  # permuted with the kv-head permutation


@dataclass(slots=True)
class HeadGroup:
    """One attention layer's projections, as blocks of head rows (Q/K/V) and columns (out)."""

    name: str
    heads: int
    kv_heads: int
    d_k: int
    rows: list[Rows]
    has_out: bool


_QKV = (
    ("W_q", "W_k", "W_v"),
    ("q_proj", "k_proj", "v_proj"),
    ("query", "key", "value"),
    ("to_q", "to_k", "to_v"),
    ("wq", "wk", "wv"),
    ("q_lin", "k_lin", "v_lin"),
    ("q", "k", "v"),
)
_PACKED = ("c_attn", "qkv", "qkv_proj", "Wqkv", "to_qkv", "in_proj", "W_qkv", "query_key_value")
_OUT = ("out", "o_proj", "out_proj", "c_proj", "to_out", "wo", "proj", "W_o", "out_lin", "o")


def _out_axis(module) -> int:
    """The axis of a projection's weight that holds its outputs (Conv1D stores [in, out])."""
    return 1 if type(module).__name__ == "Conv1D" else 0


def _is_projection(module) -> bool:
    weight = getattr(module, "weight", None)
    return isinstance(weight, torch.Tensor) and weight.dim() == 2


def _proj_rows(prefix: str, module, offset: int, heads: int, d_k: int, kv: bool) -> list[Rows]:
    axis = _out_axis(module)
    rows = [Rows(f"{prefix}weight", axis, offset, heads, d_k, kv)]
    if isinstance(getattr(module, "bias", None), torch.Tensor):
        rows.append(Rows(f"{prefix}bias", 0, offset, heads, d_k, kv))
    return rows


def _out_columns(prefix: str, module, heads: int, d_k: int) -> list[Rows]:
    return [Rows(f"{prefix}weight", 1 - _out_axis(module), 0, heads, d_k)]


def find_heads(model, watch: Watch | None, traced=None) -> list[HeadGroup]:
    """Attention layers whose head blocks can be permuted: from the trace (Linears whose
    outputs become Q, K, V and the one that reads the context), else by attribute names.
    `traced` is the copy the trace ran, when it is not `model` (names are the same)."""
    names = {id(m): n for n, m in (traced or model).named_modules()}
    groups: list[HeadGroup] = []
    traced_group = _from_trace(model, watch, names) if watch is not None else None
    if traced_group is not None:
        groups.append(traced_group)
    seen = {g.name for g in groups}
    by_name = dict((traced or model).named_modules())
    for name, module in model.named_modules():
        if name in seen:
            continue
        group = _from_attributes(name, module, watch, by_name.get(name))
        if group is not None:
            if not group.has_out and watch is not None:
                _out_by_call_order(model, group, watch, names)
            groups.append(group)
            seen.add(name)
    return groups


def refused(model, watch: Watch | None, traced=None) -> str:
    """Why a packed Q/K/V projection cannot be permuted by head blocks, when one cannot:
    its output is not cut into [Q | K | V] blocks of heads (CodeGen's [mp_num, ...]
    layout, GPT-NeoX's [heads, 3 * d_k])."""
    if watch is None:
        return ""
    by_name = dict((traced or model).named_modules())
    for name, module in model.named_modules():
        sizes = _sizes(module)
        if sizes is None:
            continue
        packed = next((n for n in _PACKED if _is_projection(getattr(module, n, None))), None)
        if packed is None or isinstance(module, torch.nn.MultiheadAttention):
            continue
        if any(_is_projection(getattr(module, q, None)) for q, _, _ in _QKV):
            continue
        why = _packed_layout(by_name.get(name, module), packed, watch, *sizes)
        if why and why != INTERLEAVED:
            return f"{name or type(module).__name__}.{packed}: {why}"
    return ""


INTERLEAVED = "interleaved"


def _packed_layout(module, packed: str, watch: Watch, heads: int, kv: int, d_k: int) -> str:
    """ "" when the packed projection's output is cut into [Q | K | V] head blocks (split
    into its three parts, or viewed as [..., 3, heads, d_k]); else what was done to it."""
    part = getattr(module, packed, None)
    use = watch.first_use.get(id(part)) if part is not None else None
    if use is None:
        # Not seen as a linear call (FalconLinear computes x @ W.T itself): how its output
        # is cut is unknown, and a guess would permute the wrong rows.
        return "the trace saw no linear call of it, so how its output is cut is unknown"
    from .. import _ops

    op, shapes = use
    family = _ops.lookup(op).family
    widths = [heads * d_k, kv * d_k, kv * d_k]
    if family == _ops.PART and [s[-1] for s in shapes] == widths:
        return ""
    if family == _ops.INDEX and shapes and shapes[0][-1] == widths[0]:
        return ""  # sliced: the queries first, [Q | K | V]
    if family == _ops.VIEW and shapes and shapes[0][-3:] == (3, heads, d_k) and kv == heads:
        return ""
    if family == _ops.VIEW and shapes and kv == heads:
        tail = shapes[0]
        if tail[-2:] == (heads, 3 * d_k) or tail[-3:] == (heads, 3, d_k):
            return INTERLEAVED  # GPT-NeoX, BLOOM: each head's [q | k | v] together
    got = " and ".join(str(list(s)) for s in shapes)
    return f"its output is cut by {op} into {got}, not into Q, K, V blocks of whole heads"


def _out_by_call_order(model, group: HeadGroup, watch: Watch, names: dict) -> None:
    """The output projection of a layer that keeps it elsewhere (BERT's SelfOutput.dense):
    the first Linear called after the layer's value projection that reads heads * d_k
    features."""
    calls = [names.get(id(module)) for module, _, _ in watch.linears]
    projections = {r.param.rpartition(".")[0] for r in group.rows}
    seen = [i for i, name in enumerate(calls) if name in projections]
    if not seen:
        return
    width = group.heads * group.d_k
    for name in calls[max(seen) + 1 :]:
        if not name:
            continue
        module = model.get_submodule(name)
        if _is_projection(module) and module.weight.shape[1 - _out_axis(module)] == width:
            group.rows += _out_columns(_prefix(name), module, group.heads, group.d_k)
            group.has_out = True
            return


def _sizes(module) -> tuple[int, int, int] | None:
    found = _axes.declared_sizes(module)
    if "heads" not in found or "d_k" not in found:
        return None
    heads, d_k = found["heads"][1], found["d_k"][1]
    kv = found.get("kv_heads", ("", heads))[1]
    if heads < 2 or heads % kv:
        return None
    return heads, kv, d_k


def _from_trace(model, watch: Watch, names: dict) -> HeadGroup | None:
    # The modules that ran F.linear (an nn.Linear, or a module with a `weight` calling it).
    by_role: dict[str, Any] = {}
    out = None
    for module, role_in, role_out in watch.linears:
        if role_out in ("Q", "K", "V") and role_out not in by_role:
            by_role[role_out] = module
        elif role_in in ("context", "out") and out is None and len(by_role) == 3:
            out = module  # `output = attn @ v; return self.wo(output)` names it "out"
    if set(by_role) != {"Q", "K", "V"} or len({id(m) for m in by_role.values()}) != 3:
        return None
    q_name = names.get(id(by_role["Q"]), "")
    owner_name = q_name.rpartition(".")[0]
    owner = model.get_submodule(owner_name) if owner_name else model
    sizes = _sizes(owner)
    if sizes is None:
        return None
    heads, kv, d_k = sizes
    rows = []
    for role in ("Q", "K", "V"):
        module = by_role[role]
        count = heads if role == "Q" else kv
        if module.weight.shape[_out_axis(module)] != count * d_k:
            return None
        rows += _proj_rows(_prefix(names[id(module)]), module, 0, count, d_k, role != "Q")
    out_name = names.get(id(out)) if out is not None else None
    if out_name is None:
        attr = next((n for n in _OUT if _is_projection(getattr(owner, n, None))), None)
        out_name = f"{_prefix(owner_name)}{attr}" if attr else None
    if out_name is not None:
        rows += _out_columns(_prefix(out_name), model.get_submodule(out_name), heads, d_k)
    return HeadGroup(owner_name, heads, kv, d_k, rows, out_name is not None)


def _prefix(name: str) -> str:
    return f"{name}." if name else ""


def _from_attributes(name: str, module, watch=None, traced=None) -> HeadGroup | None:
    sizes = _sizes(module)
    if sizes is None:
        return None
    heads, kv, d_k = sizes
    base = _prefix(name)
    if isinstance(module, torch.nn.MultiheadAttention):
        if not module._qkv_same_embed_dim or module.bias_k is not None:
            return None
        e = module.embed_dim
        rows = [Rows(f"{base}in_proj_weight", 0, i * e, heads, d_k) for i in range(3)]
        if module.in_proj_bias is not None:
            rows += [Rows(f"{base}in_proj_bias", 0, i * e, heads, d_k) for i in range(3)]
        rows += _out_columns(f"{base}out_proj.", module.out_proj, heads, d_k)
        return HeadGroup(name, heads, heads, d_k, rows, True)
    rows = []
    for q, k, v in _QKV:
        parts: list = [getattr(module, n, None) for n in (q, k, v)]  # whatever the names hold
        if all(_is_projection(p) for p in parts):
            for attr, part, count, is_kv in (
                (q, parts[0], heads, False),
                (k, parts[1], kv, True),
                (v, parts[2], kv, True),
            ):
                if part.weight.shape[_out_axis(part)] != count * d_k:
                    return None
                rows += _proj_rows(f"{base}{attr}.", part, 0, count, d_k, is_kv)
            break
    else:
        packed = next((n for n in _PACKED if _is_projection(getattr(module, n, None))), None)
        if packed is None:
            return None
        part = getattr(module, packed)
        if part.weight.shape[_out_axis(part)] != (heads + 2 * kv) * d_k:
            return None
        layout = _packed_layout(traced or module, packed, watch, heads, kv, d_k) if watch else ""
        if layout == INTERLEAVED:
            rows += _proj_rows(f"{base}{packed}.", part, 0, heads, 3 * d_k, False)
        elif layout:
            return None
        else:
            for offset, count, is_kv in (
                (0, heads, False),
                (heads * d_k, kv, True),
                ((heads + kv) * d_k, kv, True),
            ):
                rows += _proj_rows(f"{base}{packed}.", part, offset, count, d_k, is_kv)
    out_name = next((n for n in _OUT if _is_projection(getattr(module, n, None))), None)
    if out_name is not None:
        rows += _out_columns(f"{base}{out_name}.", getattr(module, out_name), heads, d_k)
    return HeadGroup(name, heads, kv, d_k, rows, out_name is not None)
