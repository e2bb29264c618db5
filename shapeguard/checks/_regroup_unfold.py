"""`regroup`'s finding of `[batch * heads]` unfolded in another order than it was
folded (`batch_mixing`): examples, or the factors within each example, trade data."""

from .._errors import Violation
from .._names import dims as D
from .._names.dims import BATCH
from ._regroup_view import ViewUnderExamination

_EINOPS = ("rearrange", "repeat", "reduce", "pack", "unpack")


class Unfolds(ViewUnderExamination):
    """A view that unfolds a fold of the batch."""

    def batch_unfold(self) -> Violation | None:
        """A split of one axis that holds the batch with other factors (`[batch * heads]`)
        whose cuts do not fall between those factors."""
        axes, entangled = self.target
        for gi, gj in self.groups:
            real_i, real_j = self.real_axes(gi, gj)
            if len(real_i) != 1 or len(real_j) < 2:
                continue
            source = self.meta.dims[real_i[0]]
            if len(source) < 2 or BATCH not in D.kinds_in(source):
                continue
            originals = set(D.normalize(source))
            cut = any(entangled[j] for j in real_j) or any(
                atom not in originals for j in real_j for atom in axes[j]
            )
            known = any(D.established_kind(a) is not None for a in source)
            if cut and self.evident(real_i, real_j, known):
                return self.unfold_violation(real_i[0], real_j)
        return None

    def unfold_violation(self, i: int, real_j, reason: str = "") -> Violation:
        source = D.normalize(self.meta.dims[i])
        folded = " * ".join(D.describe_atom(a) for a in source)
        sizes = [a[2] for a in source]
        cut_sizes = [self.resolved[j] for j in real_j]
        why = reason or (
            f"it cuts the {self.x.shape[i]} entries into "
            f"{' x '.join(map(str, cut_sizes))}, not into the "
            f"{' x '.join(map(str, sizes))} they were folded from"
        )
        site = self.call.site
        if site is not None and site.callee in _EINOPS:
            letters = " ".join((D.atom_name(a) or "x")[0] for a in source)
            hint = (
                f"the pattern must unfold the group in the order it was folded, "
                f"[{folded}]: write ({letters}) on the left of the arrow, as in the fold"
            )
        else:
            order = ", ".join(D.describe_atom(a) for a in source)
            hint = (
                f"unfold in the order of the fold, [{folded}]: {self._unfold_call(sizes, real_j)}; "
                f"its axes are then [{order}, ...] already, so no transpose swaps them back"
            )
        return Violation(
            "batch_mixing",
            f"{self.expr}: unfolds [{folded}] ({self.x.shape[i]}) in another order than it was "
            f"folded: {why}, {_who_trades(source, sizes, cut_sizes, reason)}",
            self.operands(),
            hint,
            severity="warning",
        )

    def _unfold_call(self, sizes: list[int], real_j: list[int]) -> str:
        """The user's own view with its sizes for the folded factors put in the fold's
        order (`view(h, B, S, d_k)` becomes `view(B, h, S, d_k)`), when that can be read."""
        spelled = f"{self.label}.view({', '.join(map(str, sizes))}, ...)"
        site = self.call.site
        if site is None or not self.call.site_matches() or len(site.args) != len(self.resolved):
            return spelled
        first = real_j[: len(sizes)]
        if sorted(self.resolved[j] for j in first) != sorted(sizes):
            return spelled
        texts = list(site.args)
        intents = self.intents
        by_size: dict[int, list[tuple[bool, str]]] = {}
        for j in first:
            intent = intents[j] if intents else None
            heads = intent is not None and intent.name == "heads"
            by_size.setdefault(self.resolved[j], []).append((heads, texts[j]))
        # Equal sizes go where the user's names say: the one that names the heads last.
        for group in by_size.values():
            group.sort(key=lambda entry: entry[0])
        for j, size in zip(first, sizes, strict=True):
            texts[j] = by_size[size].pop(0)[1]
        return f"{self.label}.{self.call.op}({', '.join(texts)})"


def _who_trades(source, sizes: list[int], cut_sizes: list[int], reason: str) -> str:
    """Whose data the wrong unfold mixes: examples, or, where the fold's outer factors
    (the batch) are cut where they were folded, the other factors within each example."""
    if reason:
        return "so examples trade their data"
    kept = 0
    while kept < min(len(sizes), len(cut_sizes)) and sizes[kept] == cut_sizes[kept]:
        kept += 1
    outer = source[:kept]
    if not kept or not any(a[0].find().kind == BATCH for a in outer):
        return "so examples trade their data"
    inner = " * ".join(D.describe_atom(a) for a in source[kept:])
    keeps = " * ".join(D.describe_atom(a) for a in outer)
    return (
        f"so within each example the [{inner}] entries trade places ([{keeps}] is the "
        "outermost factor in both orders: no example takes another's data)"
    )
