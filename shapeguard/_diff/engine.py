"""`shapeguard.diff`: run a reference and a port on the same seeded inputs with matched
weights, and report the first aligned tensor where they part ways.

Nothing of the user's state changes: each side runs in eval mode (unless `train=True`)
with the random state forked and seeded the same, the modes put back afterwards; the
port's own weights are put back (`weights.lent`); a backend switched for one side is
switched back; a dtype other than the model's runs on a copy.
"""

import contextlib
import copy
import os
from collections.abc import Iterator, Mapping
from typing import Any

from .. import _config
from . import compare as _compare
from .capture import Captured, Flow, capture
from .explain import Pair, name_difference
from .padding import Padding, from_inputs
from .result import DiffResult, Divergence, Side
from .result_set import DiffSet
from .weights import Matched, lent, match, module_aliases


class DiffOptionError(ValueError):
    """`backends` or `dtypes` that the models cannot take."""


# Named sizes read from a model's config for `Pair.sizes` (the catalogue's scale ratios).
_SIZE_FIELDS = {
    "heads": ("num_attention_heads", "n_head", "n_heads", "num_heads"),
    "kv_heads": ("num_key_value_heads", "n_kv_heads"),
    "d_model": ("hidden_size", "n_embd", "d_model", "dim"),
    "head_dim": ("head_dim",),
}


def diff(
    model_a,
    model_b=None,
    /,
    *inputs,
    weights: Any = "copy",
    backends: tuple[str, ...] | None = None,
    dtypes: tuple[str, str] | None = None,
    train: bool = False,
    seed: int = 0,
    **kwargs,
) -> DiffResult | DiffSet:
    """Compare `model_b` (the port) with `model_a` (the reference) on the same inputs.

    Args:
        model_a: the reference, an `nn.Module`.
        model_b: the port; None (or `model_a` itself) compares the model with itself on
            two `backends` or two `dtypes`.
        *inputs, **kwargs: the forward's inputs, given to both sides (floating tensors
            cast to a side's dtype when `dtypes` is given).
        weights: "copy" (the reference's weights lent to the port by state-dict names,
            then matching shapes in module order), "none", or a mapping
            {ref_name: port_name} tried first.
        backends: two or more transformers `attn_implementation`s, ("eager", "sdpa");
            with three or more each is compared with the first (a `DiffSet`).
        dtypes: two dtypes by name, ("float32", "bfloat16").
        train: run both sides in train mode (dropout then draws the same seeded numbers).
        seed: the seed both sides' random state starts from.

    Returns:
        A `DiffResult`: `.agree`, `.first`, `.matched`; `str()` is the report. With three
        or more backends a `DiffSet`: `.results` (one per pair), `.agree`, `.first`.

    Examples:
        >>> import torch, shapeguard
        >>> ref = torch.nn.MultiheadAttention(16, 4, batch_first=True)
        >>> port = torch.nn.MultiheadAttention(16, 4, batch_first=True)
        >>> x = torch.randn(3, 7, 16)
        >>> shapeguard.diff(ref, port, x, x, x).agree
        True
    """
    if backends is not None and len(backends) != 2:
        if len(backends) < 2:
            raise DiffOptionError(f"backends: {backends!r}: give two or more")
        return DiffSet(
            [
                _diff_pair(model_a, model_b, inputs, kwargs, weights, (backends[0], other),
                           dtypes, train, seed)
                for other in backends[1:]
            ]
        )  # fmt: skip
    return _diff_pair(model_a, model_b, inputs, kwargs, weights, backends, dtypes, train, seed)


def _diff_pair(
    model_a, model_b, inputs, kwargs, weights, backends, dtypes, train: bool, seed: int
) -> DiffResult:
    same = model_b is None or model_b is model_a
    port_model = model_a if same else model_b
    names = _names(model_a, port_model, same, backends, dtypes)
    matched = Matched("same model") if same else match(model_a, port_model, weights)
    aliases = module_aliases(matched)
    a_backend, b_backend = backends if backends else (None, None)
    a_dtype, b_dtype = dtypes if dtypes else (None, None)
    with contextlib.ExitStack() as stack:
        ref = stack.enter_context(_as_dtype(model_a, a_dtype))
        port = stack.enter_context(_as_dtype(port_model, b_dtype))
        stack.enter_context(lent(model_a, port, matched) if not same else contextlib.nullcontext())
        ref_flow = _run(ref, a_backend, a_dtype, inputs, kwargs, train, seed, {})
        port_flow = _run(port, b_backend, b_dtype, inputs, kwargs, train, seed, aliases)
    # The comparison's own torch calls (and the catalogue's candidates, wrong on purpose)
    # are no part of the user's program: unchecked in a trace open around the call.
    with _config.disabled():
        padding = from_inputs(kwargs)
        return _result(names, model_a, ref_flow, port_flow, matched, padding)


def _names(ref, port, same: bool, backends, dtypes) -> tuple[str, str]:
    a, b = type(ref).__name__, type(port).__name__
    if backends:
        a, b = f"{a}[{backends[0]}]", f"{b}[{backends[1]}]"
    if dtypes:
        a, b = f"{a}[{dtypes[0]}]", f"{b}[{dtypes[1]}]"
    if a == b and not same:
        a, b = f"{a} (reference)", f"{b} (port)"
    return a, b


def _run(model, backend, dtype, inputs, kwargs, train: bool, seed: int, aliases) -> Flow:
    import torch

    args = tuple(_cast(x, dtype) for x in inputs)
    kw = {k: _cast(v, dtype) for k, v in kwargs.items()}
    with (
        _backend(model, backend),
        _mode(model, train),
        torch.random.fork_rng(devices=[]),
    ):
        torch.manual_seed(seed)
        flow, _ = capture(model, args, kw, aliases=aliases)
    return flow


def _cast(value, dtype):
    import torch

    if dtype is None or not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return value
    return value.to(getattr(torch, dtype))


@contextlib.contextmanager
def _as_dtype(model, dtype) -> Iterator[Any]:
    """The model in `dtype`: itself when it is in it already, else a converted copy."""
    import torch

    if dtype is None:
        yield model
        return
    wanted = getattr(torch, dtype, None)
    if not isinstance(wanted, torch.dtype):
        raise DiffOptionError(f"dtypes: {dtype!r} is not a torch dtype (float32, bfloat16, ...)")
    current = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    yield model if current in (None, wanted) else copy.deepcopy(model).to(wanted)


@contextlib.contextmanager
def _backend(model, backend) -> Iterator[None]:
    """`model` on the transformers attention implementation `backend`, switched back after."""
    if backend is None:
        yield
        return
    config = getattr(model, "config", None)
    setter = getattr(model, "set_attn_implementation", None)
    if config is None or setter is None:
        raise DiffOptionError(
            f"backends: {type(model).__name__} is not a transformers model "
            "(no config.attn_implementation to switch)"
        )
    saved = getattr(config, "_attn_implementation", None)
    try:
        setter(backend)
    except (ValueError, ImportError) as error:
        raise DiffOptionError(f"backends: {backend!r}: {error}") from None
    if getattr(config, "_attn_implementation", None) != backend:
        # transformers declined without raising (a model not on the attention interface):
        # both sides would run one implementation and agree by construction.
        if saved is not None:
            setter(saved)
        raise DiffOptionError(
            f"backends: {type(model).__name__} kept attn_implementation {saved!r} when "
            f"asked for {backend!r} (it cannot switch after it is built)"
        )
    try:
        yield
    finally:
        if saved is not None:
            setter(saved)


@contextlib.contextmanager
def _mode(model, train: bool) -> Iterator[None]:
    """Every module in train or eval mode for the block, each one's own mode after."""
    saved = [(m, m.training) for m in model.modules()]
    model.train(train)
    try:
        yield
    finally:
        for module, training in saved:
            module.training = training


def _result(names, ref_model, ref: Flow, port: Flow, matched: Matched, padding) -> DiffResult:
    comparison = _compare.first_divergence(ref, port, padding)
    alignment = comparison.alignment
    agreeing = [m for m in comparison.measured if m.agrees]
    largest = max((m.ratio for m in agreeing), default=0.0)
    result = DiffResult(
        ref_name=names[0],
        port_name=names[1],
        first=None,
        matched=matched,
        compared=len(comparison.measured),
        aligned=len(alignment.common),
        ref_only=alignment.ref_only,
        port_only=alignment.port_only,
        incomparable=alignment.incomparable,
        skipped=[*ref.skipped, *port.skipped],
        largest=largest,
        tolerance=_compare.flow_tolerance(ref, port),
        flows={
            "ref": ref.order(),
            "port": port.order(),
            "agree": [m.key for m in agreeing],
            "first": comparison.first.key if comparison.first else None,
        },
    )
    if padding is not None:
        result.notes.append(_padding_note(padding, comparison.measured))
    m = comparison.first
    if m is not None:
        a, b = ref.tensors[m.key], port.tensors[m.key]
        divergence = Divergence(
            key=m.key,
            role=a.role,
            ref=_side(a),
            port=_side(b),
            max_error=m.max_error,
            bad=m.bad,
            total=m.total,
            atol=m.atol,
            rtol=m.rtol,
            axes=_compare.extent(a, b, m),
            upstream=comparison.upstream,
            position=len(comparison.measured),
        )
        sizes = _sizes(ref_model)
        pair = _pair(a, b, m, comparison.upstream, ref, port, sizes)
        divergence.difference = _named(pair, result.notes)
        if divergence.difference is None and a.role == "scores":
            divergence.difference = _named_on_weights(m, pair, ref, port, result.notes)
        result.first = divergence
    return result


def _padding_note(padding: Padding, measured) -> str:
    tied = sum(1 for m in measured if m.skip is not None)
    return (
        f"padded positions not compared: {padding.count} of {padding.total} "
        f"({padding.source} 0), in the {tied} of {len(measured)} compared tensors with "
        "axes tied to the mask's (by the op's contract, or the one axis of each size); "
        "the others compared whole"
    )


def _side(c: Captured) -> Side:
    return Side(c.path, c.site, c.source, list(c.values.shape), c.dtype)


def _pair(a: Captured, b: Captured, m, upstream, ref: Flow, port: Flow, sizes) -> Pair:
    before = tuple(
        Pair(ref.tensors[k].values, port.tensors[k].values, k, ref.tensors[k].role,
             ref.tensors[k].axes, (), sizes, m.atol, m.rtol)
        for k in upstream
    )  # fmt: skip
    return Pair(a.values, b.values, m.key, a.role, a.axes, before, sizes, m.atol, m.rtol,
                site=_site_operands(m.key, a.role, ref, port),
                ref_before=_ref_before(m.key, ref, port))  # fmt: skip


# The roles of one attention site whose order a product's operands may have swapped.
_OPERANDS = ("Q", "K")


def _site_operands(key: str, role: str, ref: Flow, port: Flow) -> dict:
    """The same site's Q and K (but `role` itself), (ref, port) each, the port's None
    where it has none (an einsum the capture does not read): same path, same occurrence."""
    base, hash_, n = key.partition(" #")
    if role not in (*_OPERANDS, "scores") or not base.endswith(role):
        return {}
    found = {}
    for other in _OPERANDS:
        other_key = base[: len(base) - len(role)] + other + hash_ + n
        a, b = ref.tensors.get(other_key), port.tensors.get(other_key)
        if other != role and a is not None:
            found[other] = (a.values, b.values if b is not None else None)
    return found


# How many reference-only tensors before a divergence are read as evidence.
REF_BEFORE = 4


def _ref_before(key: str, ref: Flow, port: Flow) -> tuple:
    """The reference's tensors made before `key` since the last one both sides have, that
    the port has no counterpart of, nearest first (a projection the port computes with
    F.linear, whose module never runs)."""
    order = ref.order()
    found: list = []
    for k in reversed(order[: order.index(key)]):
        if k in port.tensors:
            break
        found.append(ref.tensors[k].values)
    return tuple(found[:REF_BEFORE])


def _named_on_weights(m, scores: Pair, ref: Flow, port: Flow, notes: list[str]):
    """The difference named on the attention weights the softmax makes of diverging scores
    (the scores themselves hold a mask's fill, where a scale or a mask is not one ratio or
    one pattern), with the scores upstream; None when that names nothing either."""
    weights_key = m.key.replace(" scores", " attn", 1)
    a, b = ref.tensors.get(weights_key), port.tensors.get(weights_key)
    if a is None or b is None or a.values.numel() != b.values.numel():
        return None
    pair = Pair(a.values, b.values, weights_key, a.role, a.axes, (scores, *scores.upstream),
                scores.sizes, scores.atol, scores.rtol)  # fmt: skip
    found = _named(pair, notes)
    if found is not None:
        notes.append(f"the difference is named on {weights_key}, the softmax of these scores")
    return found


def _named(pair: Pair, notes: list[str]):
    """`name_difference(pair)`; a failure of the catalogue names nothing (and is raised
    under SHAPEGUARD_INTERNAL_ERRORS=raise, as shapeguard's own suite runs)."""
    try:
        return name_difference(pair)
    except Exception as error:
        if os.environ.get("SHAPEGUARD_INTERNAL_ERRORS") == "raise":
            raise
        notes.append(f"naming the difference failed ({type(error).__name__}: {error})")
        return None


def _sizes(model) -> Mapping[str, int]:
    config = getattr(model, "config", None)
    found: dict[str, int] = {}
    if config is None:
        return found
    for name, fields in _SIZE_FIELDS.items():
        for f in fields:
            value = getattr(config, f, None)
            if isinstance(value, int):
                found[name] = value
                break
    if "head_dim" not in found and "heads" in found and "d_model" in found:
        found["head_dim"] = found["d_model"] // found["heads"]
    return found
