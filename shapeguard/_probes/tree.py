"""Tensors nested in a forward's inputs and outputs: found, replaced, picked out."""

from collections.abc import Callable

import torch


def leaves(obj, path=()) -> list[tuple[tuple, torch.Tensor]]:
    """Every tensor in nested tuples, lists and dicts, with its path."""
    if isinstance(obj, torch.Tensor):
        return [(path, obj)]
    found = []
    if isinstance(obj, tuple | list):
        for i, item in enumerate(obj):
            found += leaves(item, (*path, i))
    elif isinstance(obj, dict):
        for key, item in obj.items():
            found += leaves(item, (*path, key))
    return found


def rebuild(obj, fn: Callable, path=()):
    """A copy of `obj` with each tensor replaced by `fn(path, tensor)`."""
    if isinstance(obj, torch.Tensor):
        return fn(path, obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(rebuild(v, fn, (*path, i)) for i, v in enumerate(obj)))
    if isinstance(obj, tuple | list):
        return type(obj)(rebuild(v, fn, (*path, i)) for i, v in enumerate(obj))
    if isinstance(obj, dict):
        return {k: rebuild(v, fn, (*path, k)) for k, v in obj.items()}
    return obj


def first_output(out) -> torch.Tensor | None:
    """The first floating tensor of a module's output (tuple, dict or ModelOutput)."""
    if isinstance(out, torch.Tensor):
        return out if out.is_floating_point() else None
    items = out.values() if isinstance(out, dict) else out if isinstance(out, tuple | list) else ()
    for item in items:
        found = first_output(item)
        if found is not None:
            return found
    return None
