"""Tensors nested in a forward's inputs and outputs: found, replaced, picked out.

Inputs and outputs nest tensors in tuples, lists, dicts (and other mappings, such as
transformers' `BatchEncoding` and `ModelOutput`) and dataclasses (a user's `Batch`);
every tensor is found by its path, and a copy of the structure can be made with some
tensors replaced. Other objects (a cache, a config) are left as they are.
"""

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch


def _is_dataclass_instance(obj) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


def container_items(obj):
    """(key, value) of a container the probes look into, or None for anything else."""
    if isinstance(obj, tuple | list):
        return list(enumerate(obj))
    if isinstance(obj, Mapping):
        return list(obj.items())
    if _is_dataclass_instance(obj):
        return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    return None


def leaves(obj, path=()) -> list[tuple[tuple, torch.Tensor]]:
    """Every tensor in nested tuples, lists, mappings and dataclasses, with its path."""
    if isinstance(obj, torch.Tensor):
        return [(path, obj)]
    items = container_items(obj)
    if items is None:
        return []
    found = []
    for key, item in items:
        found += leaves(item, (*path, key))
    return found


def op_tensors(obj) -> list[torch.Tensor]:
    """The tensors of an op's arguments or outputs, in order, nested in tuples, lists and
    dicts only: what torch hands an observer on every op (`leaves` also walks mappings and
    dataclasses and builds paths, a cost an observer would pay per op)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, list | tuple):
        return [t for item in obj for t in op_tensors(item)]
    return []


def rebuild(obj, fn: Callable, path=()):
    """A copy of `obj` with each tensor replaced by `fn(path, tensor)`."""
    if isinstance(obj, torch.Tensor):
        return fn(path, obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(rebuild(v, fn, (*path, i)) for i, v in enumerate(obj)))
    if isinstance(obj, tuple | list):
        return type(obj)(rebuild(v, fn, (*path, i)) for i, v in enumerate(obj))
    if isinstance(obj, dict) and type(obj) is dict:
        return {k: rebuild(v, fn, (*path, k)) for k, v in obj.items()}
    if isinstance(obj, Mapping):
        values = {k: rebuild(v, fn, (*path, k)) for k, v in obj.items()}
        try:
            new: Any = copy.copy(obj)  # any Mapping: one refusing assignment falls back below
            for k, v in values.items():
                new[k] = v
            return new
        except Exception:
            return values
    if _is_dataclass_instance(obj):
        new = copy.copy(obj)
        for f in dataclasses.fields(obj):
            object.__setattr__(new, f.name, rebuild(getattr(obj, f.name), fn, (*path, f.name)))
        return new
    return obj


def pick(obj, path: tuple):
    """The value at `path` in a nested structure (None when it is not there)."""
    for key in path:
        items = container_items(obj)
        if items is None:
            return None
        found = dict(items) if not isinstance(obj, tuple | list) else None
        if found is not None:
            if key not in found:
                return None
            obj = found[key]
        else:
            if not isinstance(key, int) or key >= len(obj):
                return None
            obj = obj[key]
    return obj


def first_output(out) -> torch.Tensor | None:
    """The first floating tensor of a module's output (tuple, dict or ModelOutput)."""
    for _, t in leaves(out):
        if t.is_floating_point():
            return t
    return None
