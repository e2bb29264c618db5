"""`shapeguard explain`: the common PyTorch (and flash-attn) shape errors, in attention terms.

Each rule matches one message family and says what it means for attention code
(which tensor is which, what the numbers are, which sizes were flattened
together) and the likely fix, in the house message format. The rules live in
`_explain.torch_messages` and `_explain.flash`; what a rule is, in `_explain.rules`.
Pure Python: no torch.
"""

from . import flash as _explain_flash
from . import torch_messages as _explain_torch
from .rules import Explanation as Explanation
from .rules import factor_pairs as factor_pairs

RULES = [*_explain_torch.RULES, *_explain_flash.RULES]


def explain(text: str) -> list[Explanation]:
    """Every recognized error message in `text` (a message or a whole traceback), in order.

    >>> [e.kind for e in explain("RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x5 and 6x7)")]
    ['linear_in_features']
    >>> explain("KeyError: 'foo'")
    []
    """
    found: list[tuple[int, int, Explanation]] = []
    for pattern, builder in RULES:
        for match in pattern.finditer(text):
            found.append((match.start(), match.end(), builder(match)))
    found.sort(key=lambda item: (item[0], -item[1]))
    out: list[Explanation] = []
    seen: set[str] = set()
    end = -1
    for start, stop, explanation in found:
        # Overlapping matches are one message read by two rules: keep the longest.
        if start < end or explanation.matched in seen:
            continue
        seen.add(explanation.matched)
        out.append(explanation)
        end = stop
    return out
