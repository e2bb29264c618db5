"""What `shapeguard.diff` returns for three or more backends (`--backends eager,sdpa,flex`):
each backend compared with the first, one `DiffResult` per pair, printed as one line per
pair and then the report of each pair that diverges."""

import json
from dataclasses import dataclass

from .result import DiffResult, Divergence

SCHEMA = "shapeguard.diff-set/1"


@dataclass(slots=True)
class DiffSet:
    """Several backends, each compared with the first.

    Attributes:
        results: one `DiffResult` per pair, in the order the backends were given.
        agree: True when every pair agrees.
        first: the first divergence of the first pair that diverges, or None.
    """

    results: list[DiffResult]

    @property
    def agree(self) -> bool:
        return all(r.agree for r in self.results)

    @property
    def first(self) -> Divergence | None:
        return next((r.first for r in self.results if r.first is not None), None)

    @property
    def ref_name(self) -> str:
        return self.results[0].ref_name

    @property
    def port_name(self) -> str:
        """The ports that diverge (all of them where none does)."""
        diverging = [r.port_name for r in self.results if not r.agree]
        return ", ".join(diverging or [r.port_name for r in self.results])

    @property
    def shown(self) -> DiffResult:
        """The pair an HTML page shows: the first that diverges, else the first."""
        return next((r for r in self.results if not r.agree), self.results[0])

    def __str__(self) -> str:
        return render_set(self)

    def as_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "ref": self.ref_name,
            "agree": self.agree,
            "pairs": [r.as_json() for r in self.results],
        }

    def to_json(self) -> str:
        return json.dumps(self.as_json(), indent=2)


def render_set(results: DiffSet) -> str:
    """A line per pair (agree, or where it first diverges and its relation), then the full
    report of each pair that diverges."""
    diverging = [r for r in results.results if not r.agree]
    n = len(results.results)
    lines = [
        f"diff: {n} backends against {results.ref_name}: {n - len(diverging)} agree, "
        f"{len(diverging)} diverge"
    ]
    for r in results.results:
        if r.first is None:
            lines.append(
                f"  {r.port_name}: agrees ({r.compared} aligned tensors within tolerance, the "
                f"largest error {r.largest:.2g} of it)"
            )
        else:
            lines.append(f"  {r.port_name}: diverges at {r.first.key}: {r.first.relation()}")
    text = "\n".join(lines) + "\n"
    return text + "".join(f"\n{r.port_name} against {r.ref_name}:\n{r}" for r in diverging)
