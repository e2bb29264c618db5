"""Helpers several test files share: tracing a model in warn mode, a findings' readout, the
zoo's input for a size setting, and the size settings of the reach tests (tests/
test_reach_sites.py, test_flex_reach.py, test_reach_xformers.py)."""

import dataclasses
import warnings

import pytest
import torch

import shapeguard
from shapeguard import ShapeWarning


def trace(model, *args):
    """`shapeguard.trace(model, *args)` in warn mode, without grad, its warnings silenced:
    the test reads the findings off the returned trace."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", ShapeWarning)
        return shapeguard.trace(model, *args, mode="warn")


def describe(found) -> str:
    """Findings as text for an assertion's message: kind, message and hint of each."""
    return "\n".join(f"[{f.kind}] {f.message}\n  hint: {f.hint}" for f in found)


def x_of(s) -> torch.Tensor:
    """A seeded `[batch, seq, d_model]` input for a size setting of tests/bug_zoo.py."""
    torch.manual_seed(0)
    return torch.randn(s.batch, s.seq, s.d_model)


@dataclasses.dataclass(frozen=True)
class ReachSizes:
    """A size setting of the reach tests: seq_k is the keys' length of cross-attention and
    of the SDPA cases with other lengths."""

    name: str
    batch: int
    heads: int
    seq: int
    seq_k: int
    d_k: int

    def lengths(self) -> list[int]:
        """Real tokens per example, right padded: the first full, the others shorter and
        different, none empty."""
        return [self.seq - (i * (self.seq - 1)) // self.batch for i in range(self.batch)]

    def key_lengths(self) -> list[int]:
        return [self.seq_k - (i * (self.seq_k - 1)) // self.batch for i in range(self.batch)]


# Pairwise distinct; batch == heads == seq == seq_k == d_k; realistic.
REACH_SETTINGS = (
    ReachSizes("distinct", 3, 4, 7, 5, 16),
    ReachSizes("coincident", 4, 4, 4, 4, 4),
    ReachSizes("realistic", 4, 8, 64, 64, 64),
)
REACH_SETTING = pytest.mark.parametrize("sizes", REACH_SETTINGS, ids=lambda s: s.name)


def findings(model, *args) -> list:
    """The findings of `trace(model, *args)`, as a list."""
    return list(trace(model, *args).findings)
