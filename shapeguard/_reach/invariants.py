"""The reach checked against the intent that can be established (padding, causality,
windows, documents, a cache): the seam every attention site calls after its reach is
read. Until intent is established for a site nothing is claimed: the reach is recorded
and shown only."""

from .._errors import Violation
from .rows import Reach


def judge(call, reach: Reach) -> tuple[Reach, list[Violation]]:
    """`reach` with the intent's padding and the flagged cells filled in, and the
    findings of the invariants at the site `call` is (SDPA, nn.MultiheadAttention, the
    softmax over masked scores, flash-attn, FlexAttention). No intent yet: (reach, [])."""
    return reach, []
