"""What a `shapeguard explain` rule is: a pattern for one message family and the
`Explanation` it builds, kept in a family's `Rules`.

A rule whose text only repeats the message's numbers is declared with `Rules.fixed`;
one that reasons about them (which axes were flattened together, which sizes would
fit) is a function decorated with `Rules.rule`. Pure Python: no torch.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass

from .._errors import Operand, format_message


@dataclass(frozen=True, slots=True)
class Explanation:
    """One recognized error message and what it means."""

    kind: str
    matched: str  # the error text as torch (or flash-attn, or Python) wrote it
    relation: str
    operands: tuple[Operand, ...] = ()
    hint: str = ""

    def render(self) -> str:
        return format_message(
            self.relation,
            source=f"torch said: {self.matched}",
            operands=self.operands,
            hint=self.hint,
        )

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "matched": self.matched,
            "relation": self.relation,
            "operands": [{"name": o.name, "shape": o.shape} for o in self.operands],
            "hint": self.hint,
        }


Builder = Callable[[re.Match], Explanation]


class Rules(list[tuple[re.Pattern[str], Builder]]):
    """One family's rules, (pattern, builder) in the order they are declared."""

    def rule(self, pattern: str):
        """Declare the decorated function as the builder for messages matching `pattern`."""

        def register(builder: Builder) -> Builder:
            self.append((re.compile(pattern), builder))
            return builder

        return register

    def fixed(
        self, pattern: str, kind: str, relation: str, hint: str, *operands: tuple[str, str]
    ) -> None:
        """Declare a rule whose relation, hint and (name, shape) operands are fixed text,
        where `{0}`, `{1}`, ... stand for the pattern's groups (stripped)."""

        def build(m: re.Match) -> Explanation:
            groups = [g.strip() for g in m.groups()]
            return Explanation(
                kind,
                m.group(0),
                relation.format(*groups),
                tuple(Operand(name, shape.format(*groups)) for name, shape in operands),
                hint.format(*groups),
            )

        self.append((re.compile(pattern), build))


# -- arithmetic the explanations show ---------------------------------------------------------


def factor_pairs(n: int, limit: int = 4) -> str:
    """Plausible `batch x seq` splits of `n` flattened rows: `1x64, 2x32, 4x16, 8x8`.

    >>> factor_pairs(64)
    '1x64, 2x32, 4x16, 8x8'
    >>> factor_pairs(7)
    '1x7'
    """
    pairs = [f"{b}x{n // b}" for b in range(1, int(n**0.5) + 1) if n % b == 0]
    return ", ".join(pairs[:limit] if len(pairs) <= limit else [*pairs[: limit - 1], pairs[-1]])


def prime_factors(n: int) -> str:
    """`12` -> `2 x 2 x 3`."""
    out, d, m = [], 2, n
    while d * d <= m:
        while m % d == 0:
            out.append(d)
            m //= d
        d += 1
    if m > 1:
        out.append(m)
    return " x ".join(map(str, out)) if out else str(n)


def ints(text: str) -> list[int]:
    """Every integer written in `text`, in order."""
    return [int(s) for s in re.findall(r"-?\d+", text)]
