"""The trace as a record: events and findings, shapes only, never tensors."""

import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._errors import Finding, ShapeError
from .._names.axes import AxisNames, format_shape

if TYPE_CHECKING:
    from .meta import TensorMeta

SCHEMA_VERSION = 2


@dataclass(slots=True)
class TensorRecord:
    """One tensor as the trace saw it: name, role, shape, axis names, dtype, bytes."""

    label: str | None
    role: str | None
    shape: tuple[int, ...]
    axes: AxisNames
    dtype: str
    nbytes: int
    device: str = "cpu"
    # The live tensor's meta, until the session closes and `settle` reads the final axis
    # names and role from it (names learned later in the forward show on every record).
    meta: "TensorMeta | None" = field(default=None, repr=False, compare=False)
    # A DTensor's placements (`Shard(2)@tp`) and this rank's shard of it; `shape` is the
    # global one and `nbytes` what this rank holds. None for a plain tensor.
    placements: tuple[str, ...] | None = None
    mesh: tuple[tuple[str, int], ...] | None = None  # (name, size) of each mesh dim
    local_shape: tuple[int, ...] | None = None
    # The trace's notes on local head axes ({("heads", 6): "12/tp2"}), shared, or None.
    notes: dict | None = field(default=None, repr=False, compare=False)
    # The names the table shows where they differ from `axes` (a graph's nodes, which
    # `axes` keeps as the conventional batch: `_names/shown.py`); None where they do not.
    shown: AxisNames | None = field(default=None, repr=False, compare=False)

    def settle(self) -> None:
        meta = self.meta
        if meta is not None:
            self.axes = meta.axes
            shown = meta.shown_axes
            self.shown = shown if shown != self.axes else None
            self.role = meta.role
            self.meta = None

    @property
    def named_shape(self) -> str:
        if self.meta is not None:
            axes = self.meta.shown_axes
        else:
            axes = self.shown if self.shown is not None else self.axes
        text = format_shape(self.shape, axes, self.notes)
        if self.placements is not None:
            text += f" {self.sharding}, local {list(self.local_shape or ())}"
        return text

    @property
    def sharding(self) -> str:
        """`Shard(2) on tp=2` for a DTensor, "" for a plain tensor."""
        if self.placements is None:
            return ""
        return ", ".join(
            f"{p} on {name}={size}"
            for p, (name, size) in zip(self.placements, self.mesh or (), strict=False)
        )

    def to_dict(self) -> dict:
        found: dict[str, object] = {
            "label": self.label,
            "role": self.role,
            "shape": list(self.shape),
            "axes": list(self.axes),
            "dtype": self.dtype,
            "bytes": self.nbytes,
            "device": self.device,
        }
        if self.placements is not None:
            found["placements"] = list(self.placements)
            found["mesh"] = {name: size for name, size in self.mesh or ()}
            found["local_shape"] = list(self.local_shape or ())
        return found


@dataclass(frozen=True, slots=True)
class Event:
    """One torch call: the op, where it ran, and the shapes that went in and came out."""

    index: int
    op: str
    module: str  # module path, "" for the root or for code outside any module
    module_type: str
    location: str  # file:line of the user's code
    source: str
    inputs: tuple[TensorRecord, ...]
    outputs: tuple[TensorRecord, ...]

    @property
    def role(self) -> str | None:
        return self.outputs[0].role if self.outputs else None

    @property
    def label(self) -> str | None:
        return self.outputs[0].label if self.outputs else None

    def to_dict(self) -> dict:
        return {
            "index": self.index,
            "op": self.op,
            "module": self.module,
            "module_type": self.module_type,
            "location": self.location,
            "source": self.source,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }


def _tensor_record(
    shape, dtype: str, device: str, itemsize: int, meta, sharded=None, *, notes=None
) -> TensorRecord:
    """`sharded`: a DTensor's (placements, mesh, local shape, local numel), as
    `_tp_session.record_sharding` gives them."""
    if sharded is None:
        numel = 1
        for s in shape:
            numel *= s
        placements = mesh = local = None
    else:
        placements, mesh, local, numel = sharded
    return TensorRecord(
        label=meta.label,
        role=meta.role,
        shape=tuple(shape),
        axes=(),
        dtype=dtype,
        nbytes=numel * itemsize,
        device=device,
        meta=meta,
        placements=placements,
        mesh=mesh,
        local_shape=local,
        notes=notes,
    )


def _named_record(shape, dtype: str, device: str, itemsize: int, names: tuple) -> TensorRecord:
    """A record from what `Trace._compact` kept: (label, role, axes)."""
    numel = 1
    for s in shape:
        numel *= s
    label, role, axes = names
    return TensorRecord(label, role, tuple(shape), axes, dtype, numel * itemsize, device)


@dataclass(slots=True)
class InternalFailure:
    """A failure of shapeguard's own code that the trace contained (`_trace/internal.py`):
    the op ran as without shapeguard. Text only: no exception, traceback or tensor is kept."""

    where: str  # what failed: "rule elementwise.arithmetic", "recording", "module entry"
    op: str  # the op (or module class) it failed on
    error: str  # "TypeError: cannot create weak reference to 'numpy.float64' object"
    raised_at: str  # file:line in shapeguard (else the innermost frame) that raised it
    location: str = ""  # the user's file:line, when known
    count: int = 1  # how often the trace met the same failure at the same places

    @property
    def message(self) -> str:
        where = f" (the user's code at {self.location})" if self.location else ""
        return (
            f"{self.where} failed on {self.op or 'a call'}: {self.error}, raised at "
            f"{self.raised_at}{where}"
        )


# Distinct internal failures a trace keeps (the same one again only counts).
MAX_INTERNAL = 64
# Distinct attention reaches a trace keeps (`TraceData.add_reach`): the same reach at the
# same site again only counts, so a long trace keeps one per site and pattern. Past this
# many the rest are counted in `reach_dropped` (each holds at most `_reach.rows.MAX_ROWS`
# rows of runs: the bound on what reach keeps).
MAX_REACH = 256


def _reach_key(reach) -> tuple:
    """What makes two reaches one (`TraceData.add_reach`): all but the event and count."""
    return (
        reach.module, reach.op, reach.location, reach.how, reach.lead, reach.seq_q,
        reach.seq_k, reach.stored, reach.patterns, reach.rows.tobytes(), reach.queries,
        reach.lead_axes, reach.padding, reach.marks,
    )  # fmt: skip


@dataclass(eq=False)
class TraceData:
    """What a shapeguard trace saw, as plain data: events, findings, and the queries and
    JSON of them. Sessions record into it; `shapeguard.Trace` (`_public_trace.py`) adds the
    context manager and the renderers, which sit above this layer."""

    mode: str = "raise"
    strict: bool = False
    max_events: int = 100_000
    # A background trace (the pytest plugin's) steps aside for traces and guarded modules
    # opened inside it, and collects their findings when they close.
    background: bool = False
    findings: list[Finding] = field(default_factory=list)
    # Findings silenced by `# shapeguard: ignore[kind]` on their line (`_suppress`).
    suppressed: list[Finding] = field(default_factory=list)
    modules_seen: int = 0
    dropped_events: int = 0
    _session: object = field(default=None, repr=False)  # the open block's (`Trace`)
    # Events as the session left them, one flat tuple per op (see `record`), built into
    # `Event`s only when read: most traces are read once, after the forward, if at all.
    _events: list[Event] = field(default_factory=list, repr=False)
    _pending: list[tuple] = field(default_factory=list, repr=False)
    # Ledgers of closed sessions that still owe the metas of their replayed events
    # (`_trace/owed.py`): paid before the events are built or compacted.
    _ledgers: list = field(default_factory=list, repr=False)
    _live: int = field(default=0, repr=False)  # sessions recording into it now
    _finding_index: dict = field(default_factory=dict, repr=False)  # see `absorb`
    _suppressed_index: dict = field(default_factory=dict, repr=False)  # see `add_suppressed`
    _forward: int = field(default=0, repr=False)  # forwards of a root module so far
    _replayed: int = field(default=0, repr=False)  # steps its sessions replayed (`_replay`)
    _steps: int = field(default=0, repr=False)  # steps its sessions made in all
    # Why its sessions' replays stepped aside, by reason (`_replay.Why`): "why did this
    # model stop replaying?". A reason of the recording ("recorded: a finding") is where
    # the session it replays stopped recording.
    replay_stops: Counter = field(default_factory=Counter, repr=False)
    # Tensor parallelism (`_tp`): notes on local head axes, {("heads", 6): "12/tp2"}, and
    # the rank, world size and sharded modules of a multi-rank run (None otherwise).
    axis_notes: dict = field(default_factory=dict, repr=False)
    distributed: dict | None = None
    # Failures of shapeguard's own code that the trace contained (`_trace/internal.py`):
    # none in a healthy run; each op it concerns ran as without shapeguard.
    internal_errors: list[InternalFailure] = field(default_factory=list)
    # Each attention site's reach (`_reach.rows.Reach`: which keys each query can see, as
    # runs, never tensors), in the order the sites ran.
    reach: list = field(default_factory=list, repr=False)
    reach_dropped: int = field(default=0, repr=False)  # distinct reaches past MAX_REACH
    _reach_index: dict = field(default_factory=dict, repr=False)  # see `add_reach`

    @property
    def events(self) -> list[Event]:
        """Every recorded op, in order."""
        if self._pending:
            self._build()
        return self._events

    @property
    def event_count(self) -> int:
        return len(self._events) + len(self._pending)

    def record(self, op, module, module_type, site, inputs, outputs, metas) -> None:
        """One op, as the session saw it: `inputs`/`outputs` are (shape, dtype name, device
        type, item size) per tensor, shapes torch.Size (ints, never tensors), and `metas`
        the inputs' metas then the outputs' in one tuple (one object kept per op, not two
        lists: see tests/test_gc_pressure.py); a replayed op shares the first six with the
        op it repeats."""
        self._pending.append((op, module, module_type, site, inputs, outputs, metas, None))

    def _pay(self) -> None:
        ledgers, self._ledgers = self._ledgers, []
        for ledger in ledgers:
            ledger.pay()

    def _build(self) -> None:
        self._pay()
        events = self._events
        notes = self.axis_notes or None

        # A tensor's static part is (shape, dtype, device, itemsize), and for a DTensor its
        # sharding (`_tp_session.record_sharding`) after them.
        def made(t: tuple, meta) -> TensorRecord:
            return _tensor_record(
                t[0], t[1], t[2], t[3], meta, t[4] if len(t) > 4 else None, notes=notes
            )

        def named(t: tuple, names) -> TensorRecord:
            return _named_record(t[0], t[1], t[2], t[3], names)

        build: Callable[[tuple, object], TensorRecord]
        for op, module, module_type, site, inputs, outputs, metas, names in self._pending:
            if metas is None:  # compacted: `names` holds the inputs' and the outputs'
                build, in_parts, out_parts = named, names[0], names[1]
            else:
                split = len(inputs)
                build, in_parts, out_parts = made, metas[:split], metas[split:]
            ins = (build(t, x) for t, x in zip(inputs, in_parts, strict=True))
            outs = (build(t, x) for t, x in zip(outputs, out_parts, strict=True))
            events.append(
                Event(
                    index=len(events),
                    op=op,
                    module=module,
                    module_type=module_type,
                    location=site.location if site is not None else "",
                    source=site.source if site is not None else "",
                    inputs=tuple(ins),
                    outputs=tuple(outs),
                )
            )
        self._pending.clear()
        if not self._live:
            self.settle()

    def _compact(self) -> None:
        """The events not built yet, with their metas read now (the session is over: no
        name changes any more) and kept as shared tuples, so that the metas and the axes
        they hold are let go. Done for a trace of several forwards, whose events would
        otherwise keep every forward's axes alive; one forward's are few."""
        self._pay()
        shared: dict = {}
        keep = shared.setdefault
        pending = self._pending
        for i, (op, module, cls, site, ins, outs, metas, _) in enumerate(pending):
            if metas is None:
                continue
            split = len(ins)
            names = (
                tuple(keep(n, n) for n in [(m.label, m.role, m.axes) for m in metas[:split]]),
                tuple(keep(n, n) for n in [(m.label, m.role, m.axes) for m in metas[split:]]),
            )
            entry = (op, module, cls, site, keep(ins, ins), keep(outs, outs), None, names)
            pending[i] = keep(entry, entry)  # a forward that repeats shares its events

    def settle(self, start: int = 0) -> None:
        """Fix the axis names and roles of the events built from `start` on (the ones not
        built yet take them when they are: nothing changes names once the session ends)."""
        if self._forward > 1 and not self._live:
            self._compact()
        for event in self._events[start:]:
            for record in event.inputs:
                record.settle()
            for record in event.outputs:
                record.settle()

    def add_finding(self, error: ShapeError, severity: str = "error") -> None:
        """Record `error` as a finding, placed after the last event the trace holds; the
        same finding again (every forward of a long trace) only counts."""
        self.absorb(Finding.of(error, severity, self.event_count))

    def add_suppressed(self, error: ShapeError, severity: str = "error") -> None:
        """Record `error` as silenced by `# shapeguard: ignore[kind]`; the same one again
        only counts, so a long trace keeps one per place and message."""
        finding = Finding.of(error, severity, self.event_count)
        key = (finding.kind, finding.severity, finding.location, finding.message)
        seen = self._suppressed_index.get(key)
        if seen is not None:
            seen.count += 1
            return
        self._suppressed_index[key] = finding
        self.suppressed.append(finding)

    def add_internal(self, failure: InternalFailure) -> None:
        """Keep `failure`; the same one again (same place, op, error and user line) only
        counts. At most `MAX_INTERNAL` distinct ones are kept (the warning told of the
        first of each kind already)."""
        for known in self.internal_errors:
            if (known.where, known.op, known.error, known.raised_at, known.location) == (
                failure.where,
                failure.op,
                failure.error,
                failure.raised_at,
                failure.location,
            ):
                known.count += failure.count
                return
        if len(self.internal_errors) < MAX_INTERNAL:
            self.internal_errors.append(failure)

    def add_reach(self, reach) -> None:
        """Keep `reach` (a `_reach.rows.Reach`), or count it on the one kept for the same
        site (module, op, location) with the same shape, rows, padding and marks: a trace
        of many forwards keeps one per site and pattern, the first event's index, and how
        often it was met. At most `MAX_REACH` distinct ones (`reach_dropped` counts the
        rest)."""
        key = _reach_key(reach)
        at = self._reach_index.get(key)
        if at is not None:
            known = self.reach[at]
            self.reach[at] = dataclasses.replace(known, count=known.count + reach.count)
            return
        if len(self.reach) >= MAX_REACH:
            self.reach_dropped += 1
            return
        self._reach_index[key] = len(self.reach)
        self.reach.append(reach)

    def absorb(self, finding: Finding) -> None:
        """Keep `finding`, unless a forward before this one (of a long trace) made the
        same ones (same kind, severity, place and message): then the n-th of this forward
        counts on the n-th of that one. Findings stay bounded however long a trace runs."""
        findings, index = self.findings, self._finding_index
        key = (finding.kind, finding.severity, finding.location, finding.message)
        entry = index.get(key)
        forward = self._forward
        if entry is not None and any(f is entry[0][-1] for f in reversed(findings)):
            stored, first = entry[0], entry[1]
            if forward != first:
                if entry[2] != forward:
                    entry[2], entry[3] = forward, 0
                n = entry[3]
                entry[3] = n + 1
                if n < len(stored):
                    stored[n].count += finding.count
                    return
            stored.append(finding)
        else:
            index[key] = [[finding], forward, forward, 0]
        findings.append(finding)

    # -- queries -------------------------------------------------------------
    def records(self, name: str) -> list[TensorRecord]:
        """Every output record whose label or role is `name`, in order."""
        return [
            record
            for event in self.events
            for record in event.outputs
            if name in (record.label, record.role)
        ]

    def shape_of(self, name: str) -> tuple[int, ...] | None:
        """The shape of the last tensor labeled or playing the role `name` (`"scores"`, `"Q"`)."""
        found = self.records(name)
        return found[-1].shape if found else None

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def to_dict(self) -> dict:
        from .._reach.as_json import reach_dict
        from .._version import __version__
        from .finding_groups import grouped

        return {
            "schema": "shapeguard.trace",
            "schema_version": SCHEMA_VERSION,
            "shapeguard_version": __version__,
            "mode": self.mode,
            "events": [e.to_dict() for e in self.events],
            # One object per finding repeated across layers, with its `modules`.
            "findings": [g.to_dict() for g in grouped(self.findings)],
            "suppressed": [f.to_dict() for f in self.suppressed],
            "dropped_events": self.dropped_events,
            "distributed": self.distributed_info(),
            "reach": [reach_dict(r) for r in self.reach],
        }

    def distributed_info(self) -> dict | None:
        """Rank, world size and sharded modules of a multi-rank run, else None."""
        from .. import _ranks

        found = dict(self.distributed) if self.distributed else {}
        _ranks.describe(found)
        return found or None

    def to_json(self, *, indent: int | None = 2) -> str:
        """The trace in the versioned JSON schema documented in docs/json-schema.md."""
        return json.dumps(self.to_dict(), indent=indent)
