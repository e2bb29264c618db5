"""A broken contract as the house message: a ShapeError raised, or a warning, and a finding."""

from dataclasses import dataclass

from .. import _reporting, _source
from .._errors import Operand, ShapeError
from .compile import Contract


@dataclass(slots=True)
class Broken:
    """What broke, as the message will say it: the relation, the shapes, the bindings, a fix."""

    relation: str
    label: str
    actual: str = ""
    expected: str = ""
    bindings: str = ""
    hint: str = ""
    annotation: str = ""
    declared: str = ""

    def operands(self) -> list[Operand]:
        rows = []
        if self.actual:
            rows.append(Operand(self.label, self.actual))
        if self.expected:
            rows.append(Operand("expected", self.expected))
        if self.annotation:
            where = f", declared at {self.declared}" if self.declared else ""
            rows.append(Operand("contract", f"{self.annotation}{where}"))
        if self.bindings:
            rows.append(Operand("bound", self.bindings))
        return rows


def report(broken: Broken, contract: Contract, owner, *, mode: str, session, where: str) -> None:
    """Raise the ShapeError, or warn, and record a finding in the open trace."""
    __tracebackhide__ = True
    site = _source.user_site()
    location = site.location if site else contract.declared_at("def")
    if not where:
        where = module_description(owner, session)
    filename, lineno = (site.filename, site.lineno) if site else contract.def_site()
    _reporting.deliver(
        # Not kept in a local: a raised error must not be held by a frame it passes
        # through (`_reporting.deliver`: the cycle it would make).
        ShapeError(
            broken.relation,
            kind="contract",
            op=getattr(contract.fn, "__name__", "forward"),
            module=where,
            location=location,
            source=site.source if site else "",
            operands=broken.operands(),
            hint=broken.hint,
        ),
        "error",
        mode=mode,
        trace=session.trace if session is not None else None,
        filename=filename,
        lineno=lineno,
        registry=contract.warn_registry,
    )


def module_description(module, session) -> str:
    """`blocks.0.attn (Attention)`: the module's path in the traced model, and its class."""
    cls = type(module).__name__
    path = session.module_path(module) if session is not None else ""
    return f"{path} ({cls})" if path else cls
