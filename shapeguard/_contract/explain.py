"""Why a call breaks its contract: the argument, the axis, the bindings so far and a fix.

The slow path, run only after beartype has rejected a call: it re-checks the
arguments one by one to learn which argument bound which dim, then finds the
first axis that breaks. Tensor values are never printed.
"""

import contextlib
import typing

import jaxtyping
from beartype.door import is_bearable

# jaxtyping keeps its dimension bindings in a thread-local stack and has no public
# API to push one seeded with known sizes; these three functions are stable since 0.2.
from jaxtyping._storage import get_shape_memo, pop_shape_memo, push_shape_memo

from .._errors import first_line
from .bindings import Bindings
from .compile import Contract, argument_values
from .hints import dtype_hint
from .locate import locate
from .render import render_actual, render_bindings, render_expected
from .report import Broken
from .spec import Spec, array_types, hint_text, spec_of


@contextlib.contextmanager
def _memo(single: dict, variadic: dict):
    """A jaxtyping dimension memo seeded with the bindings so far, for one check."""
    memos = push_shape_memo({})
    memos[0].update(single)
    memos[1].update(variadic)
    try:
        yield
    finally:
        pop_shape_memo()


def _walk_arguments(contract: Contract, bound: Bindings, args, kwargs):
    """Check the arguments one by one, noting which argument bound which dim.

    Returns (single, variadic, sources, failing) where `failing` is the first
    (param, label, value) that breaks its annotation, or None.
    """
    single = dict(bound.sizes)
    variadic: dict = {}
    sources = dict(bound.sources)
    for p, label, value in argument_values(contract, args, kwargs):
        with _memo(single, variadic):
            try:
                ok = is_bearable(value, p.hint)
                after_single, after_variadic = get_shape_memo()[:2]
            except jaxtyping.AnnotationError:
                ok, after_single, after_variadic = False, single, variadic
        if not ok:
            return single, variadic, sources, (p, label, value)
        for name in after_single:
            sources.setdefault(name, label)
        for name in after_variadic:
            sources.setdefault("*" + name, label)
        single, variadic = dict(after_single), dict(after_variadic)
    return single, variadic, sources, None


def explain_arguments(contract: Contract, bound: Bindings, args, kwargs) -> Broken:
    """Why the arguments break their annotations: the first one that does, and where."""
    single, variadic, sources, failing = _walk_arguments(contract, bound, args, kwargs)
    if failing is not None:
        p, label, value = failing
        broken = _explain_value(label, p.hint, value, single, variadic, sources)
        broken.annotation = f"{p.name}: {hint_text(p.hint)}"
        broken.declared = contract.declared_at(p.name)
        return broken
    # beartype failed but each argument passes alone: say so, without values
    return Broken(
        relation=f"{contract.qualname}: the arguments break their contract together",
        label="arguments",
        bindings=render_bindings(single, variadic, sources),
        hint="check the annotations of the arguments against each other",
    )


def explain_return(contract: Contract, bound: Bindings, output, args, kwargs) -> Broken:
    """Why the return value breaks its annotation, given what the arguments bound."""
    single, variadic, sources, _ = _walk_arguments(contract, bound, args, kwargs)
    broken = _explain_value("output", contract.returns, output, single, variadic, sources)
    broken.declared = contract.declared_at("return")
    broken.annotation = f"-> {hint_text(contract.returns)}"
    return broken


def _explain_value(label: str, hint, value, single: dict, variadic: dict, sources: dict) -> Broken:
    """The first reason `value` breaks `hint`, given the bindings so far."""
    text = hint_text(hint)
    bindings = render_bindings(single, variadic, sources)
    if value is None:
        return Broken(
            relation=f"{label} is None, its contract says {text}",
            label=label,
            bindings=bindings,
            hint=f'pass {label}, or annotate it "{text} | None" if it may be left out',
        )
    origin = typing.get_origin(hint)
    if origin is tuple and isinstance(value, tuple | list):
        items = typing.get_args(hint)
        if len(items) != 2 or items[1] is not Ellipsis:
            if len(items) != len(value):
                return Broken(
                    relation=f"{label} has {len(value)} items, its contract says {len(items)}",
                    label=label,
                    bindings=bindings,
                    hint=f"return {len(items)} values, as {text} says",
                )
            for k, (item_hint, item) in enumerate(zip(items, value, strict=True)):
                if not _passes(item, item_hint, single, variadic):
                    return _explain_value(
                        f"{label}[{k}]", item_hint, item, single, variadic, sources
                    )
                _bind_from(item, item_hint, single, variadic, sources, f"{label}[{k}]")
    candidates = [spec_of(a) for a in array_types(hint) if typing.get_origin(hint) is not tuple]
    if not candidates or not _of_its_array_class(value, hint):
        kind = type(value).__name__
        array = candidates[0].array_label if candidates else ""
        what = f"a {array}" if candidates else text
        shaped = render_expected(candidates[0], single, variadic) if candidates else ""
        return Broken(
            relation=f"{label} is {kind}, not {what} as its contract says",
            label=label,
            bindings=bindings,
            hint=f"pass a {'torch.Tensor' if array == 'Tensor' else array} shaped {shaped}"
            if candidates
            else f"pass a value of type {text}",
        )
    dtype = _dtype_name(value)
    fitting = [s for s in candidates if s.dtypes is None or dtype in s.dtypes]
    shape = tuple(int(s) for s in value.shape)
    if not fitting:
        spec = candidates[0]
        return Broken(
            relation=f"{label} has dtype {dtype}, its contract says {spec.dtype_label}",
            label=label,
            actual=f"{render_actual(spec, shape, single)} {dtype}",
            expected=render_expected(spec, single, variadic),
            bindings=bindings,
            hint=dtype_hint(label, spec),
        )
    for spec in fitting:
        trial_single, trial_variadic, trial_sources = dict(single), dict(variadic), dict(sources)
        broken = locate(spec, shape, label, trial_single, trial_variadic, trial_sources)
        if broken is not None:
            broken.actual = render_actual(spec, shape, trial_single)
            broken.expected = render_expected(spec, trial_single, trial_variadic)
            broken.bindings = render_bindings(trial_single, trial_variadic, trial_sources)
            return broken
    # jaxtyping and this walk disagree (f-string dims, pytrees): quote jaxtyping's reason
    reason = _jaxtyping_reason(fitting[0], hint, value, single, variadic)
    return Broken(
        relation=f"{label} breaks its contract: {reason}",
        label=label,
        actual=render_actual(fitting[0], shape, single),
        expected=render_expected(fitting[0], single, variadic),
        bindings=bindings,
    )


def _passes(value, hint, single: dict, variadic: dict) -> bool:
    """Whether `value` fits `hint` with the bindings so far (which it leaves as they are)."""
    with _memo(single, variadic):
        try:
            return is_bearable(value, hint)
        except jaxtyping.AnnotationError:
            return False


def _bind_from(value, hint, single: dict, variadic: dict, sources: dict, label: str) -> None:
    """Add the dims `value` binds to the bindings, noting `label` as their source."""
    with _memo(single, variadic):
        is_bearable(value, hint)
        after_single, after_variadic = get_shape_memo()[:2]
    for name in after_single.keys() - single.keys():
        sources[name] = label
    single.update(after_single)
    variadic.update(after_variadic)


def _jaxtyping_reason(array_type_spec: Spec, hint, value, single, variadic) -> str:
    """jaxtyping's own reason for rejecting `value`, for when the axis walk finds none."""
    for array_type in array_types(hint):
        if spec_of(array_type) is array_type_spec:
            with _memo(single, variadic):
                try:
                    reason = array_type.__instancecheck_str__(value)
                except Exception as error:  # an AnnotationError names the unbound axis
                    reason = first_line(error)
            if reason:
                return reason.rstrip(".")
    return "jaxtyping rejects it"


def _of_its_array_class(value, hint) -> bool:
    """Whether `value` is an instance of an array class its contract names (`torch.Tensor`
    in `Float[Tensor, "..."]`, `np.ndarray` in `Float[np.ndarray, "..."]`), as jaxtyping
    asks; its `Any` array class takes whatever has a shape and a dtype, as jaxtyping's does."""
    for array_type in array_types(hint):
        cls = array_type.array_type
        if cls is typing.Any:
            if hasattr(value, "shape") and hasattr(value, "dtype"):
                return True
        elif isinstance(cls, type) and isinstance(value, cls):
            return True
    return False


def _dtype_name(value) -> str:
    """The dtype's name as jaxtyping compares it with a contract's dtypes (`float32`; a
    NumPy dtype by its scalar type's name): not `_values.dtype_name`."""
    dtype = value.dtype
    name = getattr(getattr(dtype, "type", None), "__name__", None)
    return name or repr(dtype).rsplit(".", 1)[-1]
