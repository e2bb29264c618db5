"""Exceptions and the one message format they all share.

Pure Python: this module must import without torch, so the pytest plugin and
`import shapeguard` stay cheap.
"""

from dataclasses import dataclass


def first_line(error: BaseException) -> str:
    """The first line of `error`'s message, stripped; "" when it has none (the callers
    say what stands in for it: the error's type name, or nothing)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


@dataclass(frozen=True, slots=True)
class Operand:
    """One line of the operand block: a name and its shape, already rendered."""

    name: str
    shape: str


@dataclass(slots=True)
class Violation(Exception):
    """A broken shape relation, as a checker sees it: no module, no source line.

    Checkers yield this; the trace layer, which knows where the user is, turns it
    into a `ShapeError` (or a `ShapeWarning`) with the context filled in.
    """

    kind: str
    relation: str
    operands: tuple[Operand, ...] = ()
    hint: str = ""
    # "error" breaks the contract of the op; "warning" is legal but suspicious.
    severity: str = "error"
    op: str = ""

    def __post_init__(self) -> None:
        Exception.__init__(self, self.relation)


@dataclass(frozen=True, slots=True)
class Context:
    """Where a violation happened, in the user's terms."""

    module: str = ""  # "blocks.0.attn (MultiHeadAttention)"
    location: str = ""  # "model.py:29"
    source: str = ""  # the stripped source line


def format_message(
    relation: str,
    *,
    module: str = "",
    location: str = "",
    source: str = "",
    operands: tuple[Operand, ...] | list[Operand] = (),
    hint: str = "",
) -> str:
    """Render the house format: relation, where, operands, hint.

    >>> print(format_message("Q.d_k (4) != K.d_k (5)", location="m.py:3",
    ...                      operands=[Operand("Q", "[d_k=4]")], hint="fix it"))
    Q.d_k (4) != K.d_k (5)
      at m.py:3
      Q      [d_k=4]
      hint: fix it
    """
    lines = [relation]
    where = []
    if module:
        where.append(f"in  {module}")
    if location:
        where.append(f"at {location}")
    if where:
        lines.append("  " + " ".join(where))
    if source:
        lines.append(f"      {source}")
    if operands:
        width = max(5, *(len(o.name) for o in operands))
        lines.extend(f"  {o.name.ljust(width)}  {o.shape}" for o in operands)
    if hint:
        lines.append(f"  hint: {hint}")
    return "\n".join(lines)


class ShapeError(RuntimeError):
    """A shape contract is broken. Subclasses RuntimeError so `except RuntimeError` still works.

    Attributes:
        kind: stable snake_case id of the broken rule (`matmul_inner`, `mask_broadcast`, ...).
        op: the torch operation, e.g. `matmul`.
        module: module path and class, e.g. `blocks.0.attn (MultiHeadAttention)`.
        location: `file:line` of the user's code.
        source: that source line.
        operands: `Operand(name, shape)` entries, shapes with axis names.
        hint: how to fix it.
        relation: the first line of the message.
    """

    def __init__(
        self,
        relation: str,
        *,
        kind: str,
        op: str = "",
        module: str = "",
        location: str = "",
        source: str = "",
        operands: tuple[Operand, ...] | list[Operand] = (),
        hint: str = "",
    ) -> None:
        self.relation = relation
        self.kind = kind
        self.op = op
        self.module = module
        self.location = location
        self.source = source
        self.operands = tuple(operands)
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        return format_message(
            self.relation,
            module=self.module,
            location=self.location,
            source=self.source,
            operands=self.operands,
            hint=self.hint,
        )

    @classmethod
    def from_violation(cls, violation: Violation, context: Context) -> "ShapeError":
        return cls(
            violation.relation,
            kind=violation.kind,
            op=violation.op,
            module=context.module,
            location=context.location,
            source=context.source,
            operands=violation.operands,
            hint=violation.hint,
        )

    def __reduce__(self):
        # Keep the fields across pickling (pytest-xdist sends reports between processes).
        return (
            _rebuild_shape_error,
            (
                self.relation,
                self.kind,
                self.op,
                self.module,
                self.location,
                self.source,
                self.operands,
                self.hint,
            ),
        )


def _rebuild_shape_error(relation, kind, op, module, location, source, operands, hint):
    return ShapeError(
        relation,
        kind=kind,
        op=op,
        module=module,
        location=location,
        source=source,
        operands=operands,
        hint=hint,
    )


class ShapeWarning(UserWarning):
    """Legal but suspicious shape use (softmax over the query axis, a bool mask added to scores)."""

    def __init__(self, message: str = "", *, kind: str = "", hint: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.hint = hint


class ContractError(ValueError):
    """The contract itself, or the way shapeguard is called, is wrong (not a shape bug).

    A `ValueError`, so code that catches bad settings as Python's own functions raise
    them catches shapeguard's too; an argument of the wrong type is a `ContractTypeError`,
    also a `TypeError`."""


class ContractTypeError(ContractError, TypeError):
    """An argument of the wrong type (`mode=1`, a list where a module belongs): a
    `ContractError` and a `TypeError`, as Python's own functions raise for a wrong type."""


class MalformedContract(ContractError):
    """A shape annotation that cannot be a contract (an axis string that does not parse, a
    symbolic dim nothing binds): a mistake in the file, like a syntax error.

    Attributes:
        location: `file:line` of the annotation (of the function when the annotation's
            own line is unknown), or "".
    """

    def __init__(self, message: str, location: str = "") -> None:
        super().__init__(message)
        self.location = location

    def __reduce__(self):
        return (type(self), (str(self), self.location))


class ShapeguardInternalWarning(RuntimeWarning):
    """shapeguard itself failed (a bug in one of its rules or in its recording): the op ran
    exactly as without shapeguard and the check was skipped there. Shown once per place in
    shapeguard and error type; a warning filter that turns it into an error only silences
    it (a shapeguard bug never fails the user's run). The trace keeps every one
    (`Trace.internal_errors`)."""


class InternalError(RuntimeError):
    """A bug in shapeguard, raised instead of contained when `SHAPEGUARD_INTERNAL_ERRORS=raise`
    (shapeguard's own test suite): a RuntimeError, never a TypeError, which torch would turn
    into `NotImplemented` inside an operator and so hide."""


@dataclass(slots=True)
class Finding:
    """A violation recorded in a trace: its parts, as the message is written from them
    (relation; module, location, source; operands; hint), and the rendered message.
    Renderers read the parts, never re-split the message."""

    kind: str
    severity: str
    message: str
    op: str = ""
    module: str = ""
    location: str = ""
    hint: str = ""
    event_index: int | None = None
    relation: str = ""  # the broken relation, the message's first line
    source: str = ""  # the user's source line
    operands: tuple[Operand, ...] = ()
    # How often the trace made this finding: a warning that repeats every forward is
    # counted here, not stored again (`event_index` is its first occurrence's).
    count: int = 1

    @classmethod
    def of(cls, error: "ShapeError", severity: str, event_index: int | None) -> "Finding":
        return cls(
            kind=error.kind,
            severity=severity,
            message=error.render(),
            op=error.op,
            module=error.module,
            location=error.location,
            hint=error.hint,
            event_index=event_index,
            relation=error.relation,
            source=error.source,
            operands=error.operands,
        )

    @property
    def headline(self) -> str:
        """The broken relation (for findings recorded from a message alone, its first line)."""
        if self.relation:
            return self.relation
        return self.message.splitlines()[0] if self.message else self.kind

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "message": self.message,
            "relation": self.headline,
            "op": self.op,
            "module": self.module,
            "location": self.location,
            "source": self.source,
            "operands": [{"name": o.name, "shape": o.shape} for o in self.operands],
            "hint": self.hint,
            "event_index": self.event_index,
            "count": self.count,
        }


for _cls in (ShapeError, ShapeWarning, ContractError, ShapeguardInternalWarning):
    # Tracebacks then read `shapeguard.ShapeError: ...`, the public name.
    _cls.__module__ = "shapeguard"
