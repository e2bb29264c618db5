"""What the reach probe keeps of its measurement: the reach within each example (a
`Reach` over the input positions, how="probe"), the dependence across examples as
counts, and how it was measured. No tensor: it is read back as runs and counts, for
the table, the JSON and the HTML drawing."""

from dataclasses import dataclass

from .._reach.rows import Reach, count, runs_text


@dataclass(frozen=True, slots=True)
class MeasuredReach:
    """The model-level reach of one `check`.

    Attributes:
        reach: per measured example (`lead` = (examples,)), per measured output
            position (`reach.kept_queries`; one row when the output keeps no
            positions), the runs of the example's own input positions that move it;
            `padding` holds each example's padded inputs and `marks` the cells of the
            counterexamples found.
        batch: the examples in the batch (the first `reach.lead[0]` were measured).
        crossing: (output example, input example, moved cells) for every pair of
            different examples where one moves the other; () where none does.
        how: how it was measured, "autograd through embed (Embedding)", ...
        positions: whether the output keeps positions (a row per position), or has one
            row per example (a pooled or last-position output).
    """

    reach: Reach
    batch: int
    crossing: tuple[tuple[int, int, int], ...]
    how: str
    positions: bool = True
    # The invariant the first confirmed counterexample breaks ("batch", "padding",
    # "causal"), "" where none was found: `check` weighs it against the probe that edits
    # for that invariant as a whole.
    broken: str = ""

    def line(self, example: int = 0, query: int | None = None) -> str:
        """`output 6 of example 0 is moved by inputs 0..6 (7 of 7)`: one measured output
        of one example (by default its last)."""
        q = self.reach.kept_queries[-1] if query is None else query
        runs = self.reach.row((example,), q)
        what = runs_text(runs).replace("keys", "inputs").replace("key", "input")
        out = f"output {q}" if self.positions else "the output"
        return (
            f"{out} of example {example} is moved by {what} ({count(runs)} of {self.reach.seq_k})"
        )

    def to_dict(self) -> dict:
        """JSON-ready values: per example and measured output position its runs of inputs
        (half-open [start, stop)), the padding and marks, and the crossings."""
        r = self.reach
        return {
            "how": self.how,
            "batch": self.batch,
            "examples": r.lead[0],
            "outputs": r.seq_q if self.positions else None,
            "inputs": r.seq_k,
            "positions": list(r.kept_queries) if self.positions else None,
            "rows": [
                [[list(run) for run in r.row((e,), q)] for q in r.kept_queries]
                for e in range(r.lead[0])
            ],
            "padding": [[list(run) for run in runs] for runs in r.padding],
            "marks": [
                {"example": index[0], "output": q, "inputs": [list(run) for run in runs]}
                for index, q, runs in r.marks
            ],
            "crossing": [
                {"output_example": a, "input_example": b, "cells": n} for a, b, n in self.crossing
            ],
        }
