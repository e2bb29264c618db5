"""Whether a module's forward can be compared with itself at all.

A probe compares a reference run with an edited one. That proves something only when
the unmodified inputs give the same outputs every time:

- the inputs hold no object of the module's own state (a cache object passed in): the
  probes cannot cut, change or copy it with the examples and tokens, and every run
  changes it;
- two runs of the unmodified inputs with the same RNG state agree: otherwise the module
  keeps state between calls;
- two runs under different RNG states tell whether the forward draws from the global
  RNG. Probe runs all start from one RNG state (`runs.Pin`), so the draws are alike where
  the shapes are; a failure can still be the draws landing elsewhere (a row moved, a
  shorter batch), so it is no counterexample.
"""

import torch

from .compare import deviation, scale_of
from .runs import first_line
from .tree import pick

# Containers the probes look into (`tree`); any other object holding tensors is state.
_PLAIN = (str, bytes, int, float, bool, complex, type(None))


def held_state(inputs) -> list[str]:
    """The inputs that are objects holding tensors the probes cannot edit (a cache, a
    state object), as "past_key_values (DynamicCache)"."""
    args, kwargs = inputs
    found = []
    for key, value in [*enumerate(args), *kwargs.items()]:
        label = key if isinstance(key, str) else f"argument {key}"
        for name, obj in _objects(value, str(label)):
            if _holds_tensors(obj):
                found.append(f"{name} ({type(obj).__name__})")
    return found


def _objects(value, name: str, depth: int = 0):
    """Objects that are neither tensors nor containers the probes look into, in `value`."""
    from .tree import container_items

    if isinstance(value, (torch.Tensor, torch.nn.Module, *_PLAIN)) or depth > 4:
        return
    items = container_items(value)
    if items is None:
        yield name, value
        return
    for key, item in items:
        yield from _objects(item, f"{name}.{key}", depth + 1)


def _holds_tensors(obj, depth: int = 0) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if depth > 3 or isinstance(obj, (*_PLAIN, torch.nn.Module, type)):
        return False
    if isinstance(obj, list | tuple | set | frozenset):
        return any(_holds_tensors(v, depth + 1) for v in list(obj)[:64])
    if isinstance(obj, dict):
        return any(_holds_tensors(v, depth + 1) for v in list(obj.values())[:64])
    try:
        fields = vars(obj)
    except TypeError:
        fields = {name: getattr(obj, name, None) for name in getattr(obj, "__slots__", ())}
    return any(_holds_tensors(v, depth + 1) for v in list(fields.values())[:64])


def outputs_apart(a: dict, b: dict) -> float:
    """How far two runs' output leaves are apart (infinite when a leaf or shape differs)."""
    worst = 0.0
    for path, want in a.items():
        got = b.get(path)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            return float("inf")
        worst = max(worst, deviation(got, want, scale_of(want)))
    return worst


def steadiness(model, inputs, refs: dict, paths, pin, rtol: float) -> tuple[str, str]:
    """(why no run of the module proves anything, why a failure is no counterexample):
    from a run under another RNG state, and, where that one differs, a second run under
    the probes' own."""
    seed = pin.seed
    try:
        pin.seed = seed + 1
        other = _leaves(model, inputs, paths)
    except Exception as error:
        return _unsteady(f"a second run of the same inputs raises ({first_line(error)})"), ""
    finally:
        pin.seed = seed
    apart = outputs_apart(refs, other)
    if apart <= rtol:
        return "", ""
    try:
        again = _leaves(model, inputs, paths)
    except Exception as error:
        return _unsteady(f"a second run of the same inputs raises ({first_line(error)})"), ""
    same = outputs_apart(refs, again)
    if same > rtol:
        return _unsteady(
            f"two runs of the same inputs with the same RNG state are {same:.2g} of the "
            "output's scale apart"
        ), ""
    return "", (
        f"the forward draws from the global RNG (under another RNG state its outputs move by "
        f"{apart:.2g} of their scale): the probe's runs start from one RNG state, but its "
        "edit moves which rows or positions the draws land on, so this difference is no "
        "counterexample"
    )


def _unsteady(what: str) -> str:
    return (
        f"the forward is not deterministic: {what}; the module keeps state between calls "
        "(a cache or a counter it updates), so no comparison of two runs proves anything"
    )


def _leaves(model, inputs, paths) -> dict:
    args, kwargs = inputs
    out = model(*args, **kwargs)
    found = {}
    for path in paths:
        value = pick(out, path)
        if isinstance(value, torch.Tensor):
            found[path] = value
    return found
