"""Which inputs an integer tensor's values come from, followed op by op through one forward.

A graph layer reads its nodes by the values of its edge index, and those values reach the
reading op through selections, masks and concatenations (torch_geometric's GATConv drops
the self-loops by a boolean mask and joins new ones before it reads a row), which make new
axes that share no identity with the input's. Axis provenance cannot link them; the data
can: an integer op's output carries the values of its integer operands, so it is noted as
coming from the inputs they came from. Only integer tensors are followed (index values,
never features), and only where an integer operand already comes from an input.
"""

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from .tree import leaves


class IndexFlow:
    """{integer tensor: the paths of the integer inputs its values come from}."""

    def __init__(self) -> None:
        self._sources = WeakTensorKeyDictionary()

    def seed(self, inputs) -> None:
        """Note each integer input leaf of `inputs` (args, kwargs) as its own source."""
        for path, t in leaves(inputs):
            if _is_index(t):
                self._sources[t] = frozenset({path})

    def sources(self, t) -> frozenset:
        """The input paths `t`'s values come from (empty: made inside, or not integer)."""
        if not isinstance(t, torch.Tensor):
            return frozenset()
        return self._sources.get(t, frozenset())

    def after(self, args, kwargs, out) -> None:
        """Carry the sources of an op's integer operands to its integer outputs."""
        if not self._sources:
            return
        found: frozenset = frozenset()
        for _, t in leaves((args, kwargs)):
            found |= self.sources(t)
        if not found:
            return
        for _, t in leaves(out):
            if _is_index(t):
                self._sources[t] = self.sources(t) | found


def _is_index(t) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and not t.is_floating_point()
        and not t.is_complex()
        and t.dtype != torch.bool
    )
