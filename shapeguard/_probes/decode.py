"""The decode-consistency probe: a cache must give the outputs the full sequence gives.

A causal module that keeps a cache of past keys and values is run twice on the same
tokens: once whole, and once as a prefill of the first P tokens followed by one token
at a time, each step feeding the cache the previous step returned. Every position must
get the same output both ways (up to the dtype's rounding); the probe names the first
decode step and position that differ, and the likely cause, from what a traced run of
that step shows (the cache rules of `checks/cache.py`, SDPA's `is_causal`, positions
that restart at 0).

Caches it drives, in the module's own way:

- transformers models (`forward(..., cache=None, use_cache=None)`, `past_key_values`
  before transformers 5, and an output that carries the cache): the cache the model makes (DynamicCache, or its
  encoder-decoder pair), and a StaticCache for decoder-only models that support one;
- a module of your own that follows the cache protocol: `forward(..., cache=None)`,
  where `cache` is a dict the module reads its past keys and values from and writes
  the new ones into, in place. shapeguard passes an empty dict with the prefill and
  the same dict with each step; the module derives the new tokens' positions from
  what the dict holds. With `cache=None` the module runs the whole sequence.
"""

import inspect
from dataclasses import dataclass
from typing import Any, cast

import torch

from .. import _ops
from .result import ProbeResult, inconclusive, not_applicable
from .runs import first_line
from .subject import Subject
from .tree import pick, rebuild

# The ops that compute positions themselves (an arange, a rotary table), not a lookup
# of a table (embedding) or a view of one: what a cached step must start at its offset.
_POSITION_MAKERS = frozenset(
    op.name for op in _ops.ALL if op.positional and not op.reads_table and not op.aliases
)

NAME = "decode consistency"
# Token-by-token decoding of at most this many positions after the prefill.
MAX_STEPS = 16


@dataclass(slots=True)
class Protocol:
    """How to run a module step by step with its cache."""

    kind: str  # "transformers" or "dict"
    cache: str = ""  # "dynamic" (the model's own) or "static"
    keyword: str = "cache"  # the forward's cache argument ("past_key_values" before 5.x)

    def describe(self) -> str:
        if self.kind == "dict":
            return "its cache= dict"
        return "a StaticCache" if self.cache == "static" else f"its own cache ({self.keyword}=)"


def protocols(model) -> list[Protocol]:
    """The ways `model` can be decoded with a cache (none: it keeps no cache)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return []
    keyword = next((k for k in ("cache", "past_key_values") if k in params), None)
    if keyword is not None and "use_cache" in params:
        found = [Protocol("transformers", "dynamic", keyword)]
        config = getattr(model, "config", None)
        if (
            getattr(type(model), "_can_compile_fullgraph", False)
            and config is not None
            and not getattr(config, "is_encoder_decoder", False)
        ):
            found.append(Protocol("transformers", "static", keyword))
        return found
    if "cache" in params and not type(model).__module__.startswith("transformers."):
        return [Protocol("dict")]  # a transformers layer takes a Cache: its model decodes
    return []


def _step_inputs(s: Subject, start: int, stop: int):
    """The inputs of the step that feeds positions [start, stop): the query group's
    tokens cut to them, its padding masks (the keys) and the key axis of a square mask
    to [0, stop)."""
    layout = s.layout

    def cut(path, t):
        leaf = layout.leaves.get(path)
        if leaf is None:
            return t
        dims = [d for d, g in leaf.seq.items() if g == 0]
        for i, d in enumerate(sorted(dims)):
            keys = leaf.padding or (len(dims) == 2 and i == 1)
            lo = 0 if keys else start
            t = t.narrow(d, lo, stop - lo)
        return t.contiguous()

    return rebuild(s.inputs, cut)


def _arguments(protocol: Protocol, inputs, state) -> tuple[tuple, dict]:
    """The forward's arguments for one step with the cache `state`."""
    args, kwargs = inputs
    if protocol.kind == "dict":
        return args, {**kwargs, "cache": state}
    return args, {**kwargs, protocol.keyword: state, "use_cache": True}


def _returned(protocol: Protocol, out, state):
    """The cache after a step: the dict itself, or the output's past_key_values."""
    if protocol.kind == "dict":
        return state
    for key in ("cache", "past_key_values"):
        new = out.get(key) if isinstance(out, dict) else getattr(out, key, None)
        if new is not None:
            return new
    raise RuntimeError("the module returned no cache with use_cache=True")


def _call(s: Subject, protocol: Protocol, inputs, state):
    """One forward with the cache `state`; (output, new state)."""
    args, kwargs = _arguments(protocol, inputs, state)
    out = s.model(*args, **kwargs)
    return out, _returned(protocol, out, state)


def _initial(s: Subject, protocol: Protocol, length: int):
    if protocol.kind == "dict":
        return {}
    if protocol.cache == "static":
        from transformers import StaticCache

        config: Any = s.model.config  # a transformers model's: only they have a static cache
        return StaticCache(config=config, max_cache_len=length)
    return None


@dataclass(slots=True)
class _Run:
    outputs: list  # per step: {path: tensor}
    starts: list[int]  # the first position of each step
    error: Exception | None = None
    failed_step: int | None = None


def _decode(s: Subject, protocol: Protocol, prefill: int, length: int) -> _Run:
    leaves = _leaves(s)
    bounds = [(0, prefill)] + [(p, p + 1) for p in range(prefill, length)]
    run = _Run([], [b[0] for b in bounds])
    try:
        state = _initial(s, protocol, length)
    except Exception as error:
        run.error, run.failed_step = error, 0
        return run
    for step, (start, stop) in enumerate(bounds):
        try:
            out, state = _call(s, protocol, _step_inputs(s, start, stop), state)
        except Exception as error:
            run.error, run.failed_step = error, step
            return run
        run.outputs.append({leaf.path: pick(out, leaf.path) for leaf in leaves})
        if step == 0 and protocol.kind == "dict" and isinstance(state, dict) and not state:
            # It took the dict but kept nothing in it: its `cache` is something else.
            run.error = RuntimeError(
                "the module put nothing into its cache= dict: it does not follow the cache "
                "protocol (its cache argument is its own)"
            )
            run.failed_step = 1
            return run
    return run


def _leaves(s: Subject):
    return [leaf for leaf in s.outputs(group=0) if len(leaf.batch) <= 1]


def decode_consistency(s: Subject) -> ProbeResult:
    """Prefill then token-by-token decoding with the module's cache gives the outputs of
    one forward over the whole sequence."""
    if not s.causal:
        return not_applicable(
            NAME, s.not_causal or "the module is not causal: decoding with a cache needs one"
        )
    found = protocols(s.model)
    if not found:
        return not_applicable(
            NAME,
            "the module keeps no cache (no cache or past_key_values with use_cache, no "
            "cache= dict; see docs/check.md for the cache protocol)",
        )
    layout = s.layout
    if not layout.queries or not _leaves(s):
        return not_applicable(NAME, layout.made_inside or "no output keeps the tokens' positions")
    if s.distributed:
        return inconclusive(NAME, f"{s.distributed}: its cache is sharded")
    length = layout.lengths[0]
    if length < 2:
        return inconclusive(NAME, "needs 2 or more tokens")
    start = _prefill(length)
    worst = 0.0
    ran = []
    for protocol in found:
        run = _decode(s, protocol, start, length)
        if run.error is not None and protocol.cache == "static" and run.failed_step == 0:
            continue  # the model cannot build or take a StaticCache: not a decode bug
        failure = _compare(s, protocol, run, start, length)
        if isinstance(failure, ProbeResult):
            return failure
        worst = max(worst, failure)
        ran.append(protocol.describe())
    if not ran:
        return inconclusive(NAME, "the module's cache could not be built")
    findings = _traced_findings(s, found[0], start, start + 1)
    if findings:
        return _failed(s, found[0], start, start + 1, 1, None, findings=findings)
    steps = length - start
    return ProbeResult(
        NAME,
        "passed",
        f"a prefill of {start} tokens then {steps} one-token step{'s' if steps > 1 else ''} "
        f"with {' and with '.join(ran)} gave the outputs of one forward over all {length} "
        f"(deviation {worst:.1e})",
        worst,
        s.rtol,
    )


def _compare(s: Subject, protocol: Protocol, run: _Run, prefill: int, length: int):
    """The largest deviation, or the failed result at the first step that differs."""
    leaves = _leaves(s)
    worst = 0.0
    for step, got in enumerate(run.outputs):
        lo = run.starts[step]
        hi = prefill if step == 0 else lo + 1
        positions = list(range(lo, hi))
        dev, first = _step_deviation(s, leaves, got, positions)
        if dev > s.rtol:
            return _failed(s, protocol, lo, hi, step, dev, first=first)
        worst = max(worst, dev)
    if run.error is not None:
        failed = cast(int, run.failed_step)  # set with the error, always
        lo = run.starts[failed]
        hi = prefill if failed == 0 else lo + 1
        return _failed(s, protocol, lo, hi, failed, None, error=run.error)
    return worst


def _step_deviation(s: Subject, leaves, got: dict, positions: list[int]):
    """(deviation, first position that differs) of one step against the full forward."""
    worst, first = 0.0, None
    for p_index, p in enumerate(positions):
        dev = s.measure(
            got,
            s.refs,
            leaves,
            positions={0: [p_index]},
            want_positions={0: [p]},
        )
        if dev > s.rtol and first is None:
            first = p
        worst = max(worst, dev)
    return worst, first


def _failed(s, protocol, lo, hi, step, dev, *, first=None, error=None, findings=None):
    where = "the prefill" if step == 0 else f"decode step {step} (the token at position {lo})"
    tokens = f"positions 0..{hi - 1}" if step == 0 else f"position {lo}"
    if findings is None:
        findings = _traced_findings(s, protocol, lo, hi)
    cause = _cause(s, protocol, lo, hi, step, findings, error)
    how = f"with {protocol.describe()}"
    if error is not None:
        head = f"{where} {how} fails: {first_line(error)}"
    elif dev is None:
        head = f"{where} {how}: the trace of the step found a shape bug in the cache's use"
    else:
        at = first if first is not None else lo
        head = (
            f"{where} {how} moved {tokens} by {_fmt(dev)} of the output's scale against one "
            f"forward over the whole sequence (tolerance {s.rtol:.0e}); the first position "
            f"that differs is {at}"
        )
    if error is not None and not findings:
        # The module raised on a step: no outputs to compare, no counterexample.
        return inconclusive(
            NAME,
            f"the module rejects a step of the decoding: {head}\n  likely cause: {cause}\n"
            "  a step the module does not run is no counterexample",
        )
    return ProbeResult(
        NAME,
        "failed",
        f"{head}\n  likely cause: {cause}\n  hint: {_hint(cause)}",
        dev,
        s.rtol,
        _op_of(findings),
    )


def _fmt(dev: float) -> str:
    return "inf (NaN appeared)" if dev == float("inf") else f"{dev:.2g}"


def _op_of(findings) -> str:
    for f in findings:
        where = f"{f.op} at {f.location}" if f.location else f.op
        return f"{where} ({f.module})" if f.module else where
    return ""


# -- what the traced step shows -----------------------------------------------------------
def _traced_findings(s: Subject, protocol: Protocol, lo: int, hi: int) -> list:
    """The trace's findings on the step feeding [lo, hi) (after the steps before it ran
    plainly to fill the cache)."""
    from .locate import traced_findings

    try:
        args, kwargs = _arguments(protocol, _step_inputs(s, lo, hi), _state_before(s, protocol, lo))
        return traced_findings(s, (args, kwargs))
    except Exception:
        return []


def _state_before(s: Subject, protocol: Protocol, lo: int):
    """The cache after the steps before position `lo` (prefill, then one at a time)."""
    length = s.layout.lengths[0]
    start = _prefill(length)
    state = _initial(s, protocol, length)
    if lo == 0:
        return state
    bounds = [(0, start)] + [(p, p + 1) for p in range(start, lo)]
    for a, b in bounds:
        _, state = _call(s, protocol, _step_inputs(s, a, b), state)
    return state


def _prefill(length: int) -> int:
    """How many tokens the prefill takes: half, and all but MAX_STEPS at most."""
    return max(1, length - MAX_STEPS, (length + 1) // 2)


def _cause(s, protocol, lo, hi, step, findings, error) -> str:
    for f in findings:
        if f.kind == "torch_error":
            stale = _stale(f.relation, lo, hi)  # torch's own words, after the op
            if stale:
                return stale
        return f"the trace of this step found {f.kind}: {f.headline}"
    if error is not None:
        stale = _stale(str(error), lo, hi)
        if stale:
            return stale
        if step == 0:
            return f"the module fails when given {protocol.describe()} (see the error above)"
    if step == 0:
        return (
            "the prefill alone differs from the full forward: the module's output depends on "
            "the length it runs at (see the length change probe)"
        )
    restart = _positions_restart(s, protocol, lo, hi)
    if restart:
        return restart
    if error is not None:
        return "the step with cached keys and values fails: see the error above"
    return (
        "the cached keys and values do not give what the full sequence gives: the cache must "
        "hold every earlier position's keys and values (after their rotation), in order, and "
        "the new token's query must see all of them and itself"
    )


def _stale(message: str, lo: int, hi: int) -> str:
    """A size mismatch between the cache's old length and cached + new: something the
    module kept from an earlier step (a mask, positions) was not extended."""
    import re

    sizes = {int(n) for n in re.findall(r"\((\d+)\)", message.splitlines()[0] if message else "")}
    if sizes == {lo, hi} and hi > lo > 0:
        return (
            f"a tensor as long as the cache before this step ({lo}) meets one as long as "
            f"cached + new ({hi}): something kept from an earlier step (a padding mask, "
            "positions) was not extended by the new token"
        )
    return ""


def _hint(cause: str) -> str:
    if "positions restart" in cause:
        return (
            "offset the new tokens' positions by the cache's length (positions start..start+T, "
            "start = the number of cached tokens) for the rotary or position table"
        )
    if "causal_alignment" in cause:
        return "on a decode step pass is_causal=False (a single query may see every cached key)"
    if "cache_axis" in cause:
        return "concatenate the cached keys and values along the sequence axis"
    if "mask_cache_length" in cause or "not extended" in cause:
        return (
            "build each step's mask over cached + new keys, [.., new, cached + new], and "
            "extend a padding mask by the new tokens"
        )
    return "compare the step's keys, values and mask with the full forward's at the same position"


def _positions_restart(s: Subject, protocol: Protocol, lo: int, hi: int) -> str:
    """Where the step's positions start at 0 instead of `lo`: a rotary table or an arange
    that equals the full run's first rows, not its rows at `lo`."""
    from .locate import record_values

    try:
        full = record_values(s, s.inputs)
        state = _state_before(s, protocol, lo)
        step = record_values(s, _arguments(protocol, _step_inputs(s, lo, hi), state))
    except Exception:
        return ""
    firsts: dict[str, torch.Tensor] = {}
    for op, where, value, _ in full:
        if op in _POSITION_MAKERS and where not in firsts:
            firsts[where] = value
    for op, where, value, _ in step:
        want = firsts.get(where)
        if op not in _POSITION_MAKERS or want is None:
            continue
        axis = _position_axis(want, value)
        if axis is None:
            continue
        n = value.shape[axis]
        if want.shape[axis] < lo + n:
            continue
        at_lo = want.narrow(axis, lo, n)
        at_zero = want.narrow(axis, 0, n)
        if torch.equal(value, at_lo) or not torch.equal(value, at_zero):
            continue
        return (
            f"positions restart at 0 on this step: {where} gives the values of position 0, not "
            f"of position {lo} (the cache holds {lo} tokens)"
        )
    return ""


def _position_axis(full: torch.Tensor, step: torch.Tensor) -> int | None:
    if full.dim() != step.dim():
        return None
    differ = [d for d in range(full.dim()) if full.shape[d] != step.shape[d]]
    if len(differ) != 1 or full.shape[differ[0]] < step.shape[differ[0]]:
        return None
    return differ[0]
