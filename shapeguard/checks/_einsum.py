"""An einsum as the user wrote it: `torch.einsum(equation, *operands)`, or einops'
`einsum(*operands, pattern)`, whose words einops turns into letters before torch sees them.
Messages name the operands and quote the equation as the user's source has them."""

from typing import NamedTuple

from .. import _source
from .._names import subscripts


class Written(NamedTuple):
    labels: tuple[str, ...]  # the user's names for the operands, in torch's order
    equation: str  # the equation or pattern as the user wrote it
    words: dict[str, str] | None  # torch's letter -> the user's word (einops), else None

    def write(self, equation: subscripts.Equation, specs, out: str) -> str:
        """An equation over torch's letters, spelled as the user would write it."""
        return equation.write(specs, out, self.words)


def written(call, operands: list) -> Written:
    """The user's labels and equation for an einsum call of `operands` (torch's order)."""
    site = call.site
    if call.site_matches() and site is not None and len(site.args) == len(operands) + 1:
        pattern = subscripts.einops_pattern(site.args, len(operands))
        if pattern is not None:
            labels = tuple(_source.short_label(a) for a in site.args[: len(operands)])
            return Written(labels, pattern, subscripts.words_of(pattern))
        if subscripts.literal(site.args[0]) is not None:  # torch.einsum("...", q, k)
            labels = tuple(call.label(i + 1, f"operand {i}") for i in range(len(operands)))
            return Written(labels, call.args[0], None)
    # Either order could be the user's (the equation a variable): the tensors' own names.
    labels = tuple(call.label_of(t, f"operand {i}") for i, t in enumerate(operands))
    return Written(labels, call.args[0], None)
