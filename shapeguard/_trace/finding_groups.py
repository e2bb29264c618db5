"""A finding that repeats at one source line across layers, reported once with the
modules it fired in (issue 30: one line of a 12-layer model was printed 36 times); and
once where it repeats in one module, word for word (a helper that rotates the queries and
then the keys: the same bug at the same call, told once with its count).

The trace keeps every finding; the renderers group them (`grouped`): the text report,
`shapeguard check`'s table, the JSON (one object per group, with a `modules` list) and
the HTML findings. Findings are one group only when they say the same thing at the same
line (kind, severity, relation, operands, hint): only the module differs.
"""

from dataclasses import dataclass

from .._errors import Finding, format_message

# How many modules a group that is not one set of layers names before "and N more".
_NAMED = 3


@dataclass(slots=True)
class FindingGroup:
    """Findings that differ only in their module, first to last as the trace made them."""

    findings: list[Finding]

    @property
    def first(self) -> Finding:
        return self.findings[0]

    @property
    def modules(self) -> list[str]:
        """The modules it fired in, each once, in the order it first fired there."""
        return list(dict.fromkeys(f.module for f in self.findings))

    @property
    def count(self) -> int:
        """How many times the trace made it, in every module."""
        return sum(f.count for f in self.findings)

    @property
    def where(self) -> str:
        """The modules it fired in: the one module, `layers 0-11 (12 modules,
        transformer.h.N.attn (CausalSelfAttention))`, or the first few and how many more."""
        modules = self.modules
        if len(modules) == 1:
            return modules[0]
        layers = _layers(modules)
        if layers is not None:
            indices, pattern = layers
            return f"layers {_ranges(indices)} ({len(modules)} modules, {pattern})"
        named = ", ".join(modules[:_NAMED])
        more = f" and {len(modules) - _NAMED} more" if len(modules) > _NAMED else ""
        return f"{len(modules)} modules ({named}{more})"

    @property
    def headline(self) -> str:
        """The relation, with the layers where there are several (a row of `check`)."""
        if len(self.modules) == 1:
            return self.first.headline
        return f"{self.first.headline} (in {self.where})"

    @property
    def message(self) -> str:
        """The first finding's message, with every module it fired in."""
        f = self.first
        if len(self.modules) == 1 or not f.relation:
            return f.message
        return format_message(
            f.relation,
            module=self.where,
            location=f.location,
            source=f.source,
            operands=f.operands,
            hint=f.hint,
        )

    def to_dict(self) -> dict:
        """The first finding's fields (`module` its module), its message with every
        module, `modules` and the `count` over all of them."""
        data = self.first.to_dict()
        data.update(message=self.message, modules=self.modules, count=self.count)
        return data


def grouped(findings: list[Finding]) -> list[FindingGroup]:
    """The findings grouped where they repeat at one source line in other modules, in the
    order of each group's first finding."""
    groups: dict[tuple, FindingGroup] = {}
    order: list[FindingGroup] = []
    for f in findings:
        if not f.location or not f.relation:
            order.append(FindingGroup([f]))
            continue
        key = (f.kind, f.severity, f.location, f.source, f.relation, f.operands, f.hint)
        if key in groups:
            groups[key].findings.append(f)
            continue
        group = FindingGroup([f])
        groups.setdefault(key, group)
        order.append(group)
    return order


def _layers(modules: list[str]) -> tuple[list[int], str] | None:
    """(layer indices, the path with N for the index) where the modules' paths differ in
    one part only, a number (`h.0.attn (Attention)`, `h.1.attn (Attention)`); else None."""
    paths = [m.split(".") for m in modules]
    if len({len(p) for p in paths}) != 1:
        return None
    differ = [i for i in range(len(paths[0])) if len({p[i] for p in paths}) > 1]
    if len(differ) != 1 or not all(p[differ[0]].isdigit() for p in paths):
        return None
    at = differ[0]
    indices = [int(p[at]) for p in paths]
    if len(set(indices)) != len(indices):
        return None
    return sorted(indices), ".".join([*paths[0][:at], "N", *paths[0][at + 1 :]])


def _ranges(indices: list[int]) -> str:
    """`0-11`, `0-3, 5, 7-9`."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
