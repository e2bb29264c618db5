"""Einsum subscripts read by their letters, not by the positions of the axes.

`torch.einsum("bihd,bjhd->bhij", q, k)` says what each axis is for the product, wherever it
sits: a letter in both inputs and in the output is a batch letter (b, h: the product keeps
them apart), a letter in both inputs only is contracted (d), a letter of one input that the
output keeps is a row of that input (i of q, j of k). The letters are the user's explicit
statement, so rules read them before anything positional. `...` is expanded to letters of its
own, right-aligned across the operands as torch broadcasts them; einops' `einsum` passes
torch the same equation with one letter per word.
"""

import ast
import string
from collections.abc import Mapping, Sequence
from typing import NamedTuple

# Stand-ins for the axes under `...` (torch's letters are ASCII, so these never clash).
_ELLIPSIS = tuple(chr(0x2460 + i) for i in range(20))


class Equation(NamedTuple):
    """An equation fitted to its operands' ranks: one letter per axis of each operand and of
    the output, `...` expanded."""

    specs: tuple[str, ...]
    out: str
    text: str  # as the user wrote it

    def write(self, specs: Sequence[str], out: str, words: Mapping[str, str] | None = None) -> str:
        """`specs -> out` spelled as the user spelled this equation (spaces, `...`), or in
        the user's words for einops' letters (`words_of`)."""
        if words is not None:
            return (
                ", ".join(_spell(s, True, words) for s in specs) + " -> " + _spell(out, True, words)
            )
        spaced = " " in self.text.split("->")[0].strip().split(",")[0].strip()
        sep = ", " if ", " in self.text else ","
        arrow = " -> " if " -> " in self.text else "->"
        return sep.join(_spell(s, spaced) for s in specs) + arrow + _spell(out, spaced)


class Product(NamedTuple):
    """The letters of a two-operand einsum by what the product does with them."""

    equation: Equation
    batch: str  # in both inputs and the output
    contracted: str  # in both inputs, not the output
    rows: str  # of the first input only, kept
    cols: str  # of the second input only, kept


def parse(equation: object, ranks: Sequence[int]) -> Equation | None:
    """The equation's letters per axis, or None when it does not fit the ranks (a loud
    mismatch for `einsum_rank`) or is not a plain equation string."""
    if not isinstance(equation, str):
        return None
    text = equation
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    parts = lhs.split(",")
    if len(parts) != len(ranks) or lhs.count("...") > len(parts) or rhs.count("...") > 1:
        return None
    widths = []
    for part, rank in zip(parts, ranks, strict=True):
        if part.count("...") > 1 or not _letters_only(part.replace("...", "")):
            return None
        named = len(part.replace("...", ""))
        if named > rank or ("..." not in part and named != rank):
            return None
        widths.append(rank - named if "..." in part else 0)
    wide = max(widths, default=0)
    if wide > len(_ELLIPSIS):
        return None
    fill = _ELLIPSIS[:wide]
    specs = tuple(
        part.replace("...", "".join(fill[wide - w :]))
        for part, w in zip(parts, widths, strict=True)
    )
    if arrow:
        if not _letters_only(rhs.replace("...", "")):
            return None
        out = rhs.replace("...", "".join(fill))
        if "..." not in rhs and wide and any(widths):
            return None
    else:
        counts: dict[str, int] = {}
        for spec in specs:
            for c in spec:
                counts[c] = counts.get(c, 0) + 1
        out = "".join(fill) + "".join(
            sorted(c for c, n in counts.items() if n == 1 and c not in fill)
        )
    if any(c not in "".join(specs) for c in out):
        return None
    return Equation(specs, out, text)


def product(equation: object, ranks: Sequence[int]) -> Product | None:
    """The letters of a two-operand einsum by role, or None."""
    if len(ranks) != 2:
        return None
    eq = parse(equation, ranks)
    if eq is None:
        return None
    a, b = eq.specs
    if len(set(a)) != len(a) or len(set(b)) != len(b):
        return None  # a repeated letter takes a diagonal: no product of two matrices
    out = eq.out
    return Product(
        eq,
        batch="".join(c for c in out if c in a and c in b),
        contracted="".join(c for c in a if c in b and c not in out),
        rows="".join(c for c in out if c in a and c not in b),
        cols="".join(c for c in out if c in b and c not in a),
    )


def is_letter(c: str) -> bool:
    """Whether `c` is a letter the user wrote (not one standing for an axis under `...`)."""
    return c not in _ELLIPSIS


def _letters_only(spec: str) -> bool:
    return all(c.isascii() and c.isalpha() for c in spec)


def einops_pattern(site_args: Sequence[str], operands: int) -> str | None:
    """The pattern of the user's `einops.einsum(*tensors, pattern)`, read from the source
    expressions of the call's arguments, when it is that call with a literal pattern (torch
    then gets the pattern with one letter per word: `words_of`)."""
    if len(site_args) != operands + 1 or literal(site_args[0]) is not None:
        return None
    pattern = literal(site_args[-1])
    return pattern if pattern is not None and "->" in pattern else None


def words_of(pattern: str) -> dict[str, str]:
    """torch's letter -> the user's word, as einops renames an einsum pattern's words: each
    new word of the inputs, left to right, gets the next of a-z, A-Z."""
    words: dict[str, str] = {}
    for part in pattern.split("->")[0].split(","):
        for word in part.split():
            if word != "..." and word not in words.values() and len(words) < 52:
                words[string.ascii_letters[len(words)]] = word
    return words


def literal(expr: str) -> str | None:
    """The value of a string literal in the source (`"b i d"`), else None."""
    try:
        value = ast.literal_eval(expr.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, str) else None


def _spell(spec: str, spaced: bool, words: Mapping[str, str] | None = None) -> str:
    parts: list[str] = []
    for c in spec:
        if c in _ELLIPSIS:
            if not parts or parts[-1] != "...":
                parts.append("...")
        else:
            parts.append(words.get(c, c) if words is not None else c)
    return (" " if spaced else "").join(parts)
