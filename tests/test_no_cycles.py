"""What a trace, a raised ShapeError and a probe check leave behind is freed when the user drops
it, by reference counting alone: no reference cycle keeps a session, its metas or the user's
tensors waiting for a full collection (on a GPU, the activations of a failed forward).

Each case runs with the collector off, then asks one collection (which saves what it finds,
`gc.DEBUG_SAVEALL`) what only it would have freed."""

import gc
import os
import sys
import warnings
import weakref
from contextlib import contextmanager

import pytest
import torch
from torch import nn

import shapeguard
from shapeguard._probes.check import run_probes
from shapeguard._public_trace import Trace

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import seed_mha  # noqa: E402

# The cases raise on purpose: the plugin's own trace would count their findings.
pytestmark = pytest.mark.no_shapeguard

# (batch, seq, heads, d_k): pairwise distinct, coincident, realistic.
SIZES = [(2, 5, 4, 8), (4, 4, 4, 4), (4, 64, 8, 64)]
IDS = ["distinct", "coincident", "realistic"]

# Objects of shapeguard's that must never be cyclic garbage, and the user's tensors.
KEPT_OUT = {"Session", "Trace", "TensorMeta", "TensorTable", "Subject", "Watch", "Tensor"}


@contextmanager
def cyclic_garbage():
    """The type names of what only the collector frees, made inside the block."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    found: list[str] = []
    try:
        yield found
    finally:
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            found.extend(type(o).__qualname__ for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.collect()
            if enabled:
                gc.enable()


def _swapped_product(batch, seq, heads, d_k):
    """scores = Q @ K with K not transposed: a rule's ShapeError before torch runs."""
    q = torch.randn(batch, heads, seq, d_k)
    k = torch.randn(batch, heads, seq + 1, d_k)
    return q @ k


def _bad_view(batch, seq, heads, d_k):
    """A view torch refuses: torch's RuntimeError, reported as a ShapeError."""
    x = torch.randn(batch, seq, heads * d_k)
    return x.view(batch, seq, heads + 1, -1, 3)


def _raised(block, *, mode="raise", background=False):
    """Run `block` in a trace, catch what it raises, drop everything; the weak references
    to the session and the block's tensors."""
    refs = []
    trace = Trace(mode=mode, background=background)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with trace:
                refs.append(weakref.ref(trace._session))
                block()
    except RuntimeError as error:
        message = str(error)
    else:
        message = ""
    refs.append(weakref.ref(trace))
    del trace
    return refs, message


def _shape_error_of(call, shape):
    """Call `call` on a new tensor of `shape`, catch its ShapeError, drop the tensor: the
    message, and whether the tensor is still alive."""
    x = torch.randn(*shape)
    seen = weakref.ref(x)
    try:
        call(x)
    except shapeguard.ShapeError as error:
        message = str(error)
    else:
        message = ""
    del x
    return message, seen() is not None


@pytest.mark.parametrize("sizes", SIZES, ids=IDS)
@pytest.mark.parametrize("background", [False, True], ids=["trace", "background"])
def test_a_shape_error_from_a_rule_leaves_no_cycle(sizes, background):
    with cyclic_garbage() as garbage:
        refs, message = _raised(lambda: _swapped_product(*sizes), background=background)
        alive = [r for r in refs if r() is not None]
    assert "k was not transposed" in message and "hint:" in message  # the rule's message
    assert alive == []
    assert KEPT_OUT.isdisjoint(garbage), sorted(KEPT_OUT.intersection(garbage))


@pytest.mark.parametrize("sizes", SIZES, ids=IDS)
def test_a_torch_error_inside_a_trace_leaves_no_cycle(sizes):
    with cyclic_garbage() as garbage:
        refs, message = _raised(lambda: _bad_view(*sizes))
        alive = [r for r in refs if r() is not None]
    assert "view" in message
    assert alive == []
    assert KEPT_OUT.isdisjoint(garbage), sorted(KEPT_OUT.intersection(garbage))


def test_an_error_warn_mode_let_through_then_torch_raised_leaves_no_cycle():
    """Warn mode returns the rule's error; torch then fails on the op and that error is
    raised from `_dispatch`, which held it."""
    with cyclic_garbage() as garbage:
        refs, message = _raised(lambda: _swapped_product(2, 5, 4, 8), mode="warn")
        alive = [r for r in refs if r() is not None]
    assert "k was not transposed" in message
    assert alive == []
    assert KEPT_OUT.isdisjoint(garbage), sorted(KEPT_OUT.intersection(garbage))


def test_a_contract_error_leaves_no_cycle():
    from jaxtyping import Float

    @shapeguard.guard
    class Projection(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(
            self, x: Float[torch.Tensor, "batch seq 8"]
        ) -> Float[torch.Tensor, "batch seq 8"]:
            return self.proj(x)

    model = Projection()
    with cyclic_garbage() as garbage:
        message, alive = _shape_error_of(model, (2, 5, 6))
    assert "x dim 2 (6) != 8, fixed by its contract" in message
    assert not alive
    assert KEPT_OUT.isdisjoint(garbage), sorted(KEPT_OUT.intersection(garbage))


def test_a_construction_error_in_a_block_leaves_no_cycle():
    """torch's bare AssertionError (embed_dim not divisible by num_heads), raised again by
    the block's exit as a ShapeError."""
    with cyclic_garbage() as garbage:
        refs, message = _raised(lambda: nn.MultiheadAttention(20, 3))
        alive = [r for r in refs if r() is not None]
    assert "3" in message and "20" in message
    assert alive == []
    assert KEPT_OUT.isdisjoint(garbage), sorted(KEPT_OUT.intersection(garbage))


@pytest.mark.parametrize("sizes", SIZES[:2], ids=IDS[:2])
def test_a_probe_check_inside_a_background_trace_leaves_no_cycle(sizes):
    """The probes' subject holds its float64 copy, the inputs and the trace's watch; a memo
    of it that held it back made a cycle, and the closed inner sessions held the background
    session they had opened inside (`_previous`), so all of it, the pytest plugin's session
    too, waited for a full collection."""
    batch, seq, heads, d_k = sizes
    model = seed_mha.MultiHeadAttention(d_model=heads * d_k, n_heads=heads)
    with cyclic_garbage() as garbage:
        x = torch.randn(batch, seq, heads * d_k)
        outer = Trace(background=True)
        with outer:
            session = weakref.ref(outer._session)
            shapeguard.trace(model, x)
            report = run_probes(model, (x,), {})
        passed = report.passed
        del outer, report, x
        alive = session() is not None
    assert passed
    assert not alive
    assert KEPT_OUT.isdisjoint(garbage), sorted(KEPT_OUT.intersection(garbage))


def test_jaxtypings_own_error_inside_a_contracted_function_leaves_no_cycle():
    """A `@jaxtyped` function called inside a `@shapeguard.contract` one fails: shapeguard
    raises its own error, with jaxtyping's (and the beartype violation under it) as context."""
    import jaxtyping
    from beartype import beartype
    from jaxtyping import Float

    @jaxtyping.jaxtyped(typechecker=beartype)
    def inner(x: Float[torch.Tensor, "b 8"]) -> Float[torch.Tensor, "b 8"]:
        return x

    @shapeguard.contract
    def outer(x: Float[torch.Tensor, "b d"]) -> Float[torch.Tensor, "b d"]:
        return inner(x)

    with cyclic_garbage() as garbage:
        message, alive = _shape_error_of(outer, (2, 6))
    assert "x breaks its contract" in message and "hint:" in message
    assert not alive
    assert KEPT_OUT.isdisjoint(garbage), sorted(KEPT_OUT.intersection(garbage))
