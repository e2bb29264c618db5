"""Bit-identity of two outputs: every tensor, through ModelOutputs, tuples and caches."""

from collections.abc import Mapping

import torch
from torch import nn


def tensors(obj, path="output", seen=None):
    """Every tensor in an output, with its path."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        yield path, obj
        return
    if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, nn.Module)) or obj is None:
        return
    seen.add(id(obj))
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from tensors(value, f"{path}.{key}", seen)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from tensors(value, f"{path}[{i}]", seen)
    elif hasattr(obj, "__dict__"):  # transformers' Cache objects keep tensors as attributes
        for key, value in vars(obj).items():
            if not key.startswith("__"):
                yield from tensors(value, f"{path}.{key}", seen)


def _same_bits(a, b):
    if torch.equal(a, b):
        return True
    # NaN != NaN: the same NaNs at the same places are still the same output.
    if not a.is_floating_point() or not torch.equal(a.isnan(), b.isnan()):
        return False
    return torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


def differences(expected, actual):
    """Paths where `actual` is not bit-identical to `expected` (empty: identical)."""
    want, got = dict(tensors(expected)), dict(tensors(actual))
    if want.keys() != got.keys():
        return [f"tensors differ: {sorted(want.keys() ^ got.keys())[:4]}"]
    out = []
    for path, a in want.items():
        b = got[path]
        if a.is_nested or b.is_nested:
            a, b = (t.to_padded_tensor(0.0) if t.is_nested else t for t in (a, b))
        if a.shape != b.shape or a.dtype != b.dtype:
            out.append(f"{path}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
        elif not _same_bits(a, b):
            diff = (a.double() - b.double()).abs().nan_to_num(float("inf")).max().item()
            out.append(f"{path}: max |diff| {diff:.3g}")
    return out


def count(obj) -> int:
    return sum(1 for _ in tensors(obj))
