"""The first axis of a tensor that breaks its spec, walked as jaxtyping walks it."""

from .. import _axes
from .hints import fixed_hint, position_hint, rank_hint
from .render import tuple_text
from .report import Broken
from .spec import Spec, eval_symbolic


def locate(spec: Spec, shape: tuple, label: str, single: dict, variadic: dict, sources: dict):
    """Walk the dims as jaxtyping does; a Broken for the first axis that breaks, else None.

    Binds new names into `single`/`variadic`/`sources` as it goes (at `label dim k`).
    """
    dims, rank = spec.dims, len(shape)
    if spec.variadic is None:
        if rank != len(dims):
            return Broken(
                relation=f'{label} has {_n_dims(rank)}, its contract "{spec.dim_str}" has {len(dims)}',
                label=label,
                hint=rank_hint(spec, shape, label, single),
            )
        positions = list(enumerate(dims))
        axes = list(range(rank))
    else:
        if rank < len(dims) - 1:
            return Broken(
                relation=f'{label} has {_n_dims(rank)}, its contract "{spec.dim_str}" needs at '
                f"least {len(dims) - 1}",
                label=label,
                hint=rank_hint(spec, shape, label, single),
            )
        i = spec.variadic
        tail = len(dims) - i - 1
        positions = [(k, dims[k]) for k in range(i)] + [
            (i + 1 + t, dims[i + 1 + t]) for t in range(tail)
        ]
        axes = list(range(i)) + [rank - tail + t for t in range(tail)]
    for (_, d), axis in zip(positions, axes, strict=True):
        size = shape[axis]
        if d.kind == "anon" or (d.broadcastable and size == 1):
            continue
        if d.kind == "fixed":
            if size != d.size:
                return Broken(
                    relation=f"{label} dim {axis} ({size}) != {d.size}, fixed by its contract",
                    label=label,
                    hint=position_hint(spec, shape, label, single)
                    or fixed_hint(label, axis, size, d.size),
                )
        elif d.kind == "symbolic":
            value = eval_symbolic(d.expr, single)
            if value is not None and value != size:
                used = sorted(n for n in single if n in d.expr)
                return Broken(
                    relation=f"{label} dim {axis} ({size}) != {d.expr} ({value})",
                    label=label,
                    hint=f"{d.expr} is {value} with "
                    + ", ".join(f"{n}={single[n]}" for n in used)
                    + f"; {label} has {size} on dim {axis}",
                )
        elif d.kind == "named":
            if d.name not in single:
                single[d.name] = size
                sources[d.name] = f"{label} dim {axis}"
            elif single[d.name] != size:
                return _named_mismatch(spec, shape, label, axis, d.name, single, sources)
    if spec.variadic is not None and dims[spec.variadic].kind == "named_var":
        d = dims[spec.variadic]
        i = spec.variadic
        new = tuple(shape[i : rank - (len(dims) - i - 1)])
        if d.name not in variadic:
            variadic[d.name] = (d.broadcastable, new)
            sources["*" + d.name] = label
            return None
        prev_broadcastable, prev = variadic[d.name]
        merged = _axes.broadcast_shapes(new, prev)
        ok = (
            new == tuple(prev)
            if not (d.broadcastable or prev_broadcastable)
            else merged is not None
        )
        if not ok:
            src = sources.get("*" + d.name, "an earlier argument")
            hint = (
                f"*{d.name} is {tuple_text(prev)} from {src}; {label} needs the same leading axes"
            )
            if merged is not None:
                hint += f', or write "*#{d.name}" in both contracts if they only need to broadcast'
            return Broken(
                relation=f"{label}.*{d.name} {tuple_text(new)} != {src}.*{d.name} {tuple_text(prev)}",
                label=label,
                hint=hint,
            )
    return None


def _n_dims(rank: int) -> str:
    return f"{rank} dim" if rank == 1 else f"{rank} dims"


def _named_mismatch(spec, shape, label, axis, name, single, sources) -> Broken:
    bound_size, size = single[name], shape[axis]
    source = sources.get(name, "an earlier argument")
    if source.startswith("self."):
        other = source
    elif source.startswith(label + " dim "):
        other = f"{label}.{name} at dim {source.rsplit(' ', 1)[1]}"
        label_name = f"{label}.{name} at dim {axis}"
        relation = f"{label_name} ({size}) != {other} ({bound_size})"
        return Broken(
            relation=relation,
            label=label,
            hint=position_hint(spec, shape, label, single)
            or f"{label} has {size} and {bound_size} where its contract repeats {name}; if they "
            f'may differ, give them two names (e.g. "{_other_name(name)}")',
        )
    elif " " in source:  # "self.d_model // self.n_heads"
        other = source
    else:
        other = f"{source}.{name}"
    relation = f"{label}.{name} ({size}) != {other} ({bound_size})"
    hint = position_hint(spec, shape, label, single)
    if not hint and label == "output":
        hint = (
            f"{name} is {bound_size} ({source}) but forward returned {size} on dim {axis}; "
            "look at the op that makes the return value"
        )
    if not hint:
        if source.startswith("self."):
            attr = source.split(" ")[0][len("self.") :]
            rebuild = f", or build the module with {attr}={size}" if " " not in source else ""
            hint = (
                f"{name} is {source} = {bound_size} in this module; give {label} {bound_size} "
                f"on dim {axis}{rebuild}"
            )
        else:
            hint = (
                f"{name} was bound to {bound_size} by {source}; if {label} may differ there, "
                f'give that axis its own name in the contract (e.g. "{_other_name(name)}")'
            )
    return Broken(relation=relation, label=label, hint=hint)


def _other_name(name: str) -> str:
    return {"seq": "seq_k", "seq_q": "seq_k", "heads": "kv_heads"}.get(name, name + "2")
