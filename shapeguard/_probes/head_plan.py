"""The head permutation `head_layout.plan_heads` builds: the plan (index permutations
of parameter axes), and the state it is chosen in, factor by factor."""

from dataclasses import dataclass, field

import torch

from .._names import dims as D

Key = tuple[int, int, int]  # (id of a root dim, stride, size): one factor of a dim


@dataclass(slots=True)
class Plan:
    """Head permutations as index permutations of parameter axes (new = old[index])."""

    params: dict[str, list[tuple[int, torch.Tensor]]] = field(default_factory=dict)
    outputs: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # of the output
    described: list[str] = field(default_factory=list)  # "4 heads of model.layers.0.attn"
    # Where the trace lost the heads (a split or merge that mixes them with the tokens):
    # those rows or columns were permuted as a correct split or merge lays them out.
    assumed: list[str] = field(default_factory=list)


class Refused(Exception):
    """A site whose heads cannot be permuted, and why."""


@dataclass(slots=True)
class HeadAtom:
    atom: tuple
    lo: int  # its stride within the axis (the product of the sizes inside it)
    kind: str  # "head", "fixed" (batch, tokens), "free" (a broadcast copy), "unknown"


@dataclass(slots=True)
class Digit:
    pos: int  # the aligned leading axis
    lo: int  # its stride within that axis
    size: int
    head: bool
    sigma: torch.Tensor | None = None


class PlanState:
    """The permutations chosen so far: per factor of a dim, and per dim its index map."""

    def __init__(self, roots: set[int], entangled: dict | None = None) -> None:
        self.roots = roots  # ids of the dims of parameter axes
        self.entangled = entangled or {}  # head_sites.HeadWatch.entangled
        self.assumed: list[str] = []  # see Plan.assumed
        self.sigma: dict[Key, torch.Tensor] = {}
        # The same factors by the projection rows they cover (`_canon`): a layer called
        # twice (shared across depth) cuts its projection anew each time, into new dims.
        self.canon: dict[tuple, torch.Tensor] = {}
        self.atoms: dict[Key, tuple] = {}
        self.dims: dict[int, D.Dim] = {}
        self.columns: dict[int, torch.Tensor] = {}  # id of a weight's input dim -> index
        self.output: list[tuple[int, torch.Tensor]] = []


def copy_state(state: PlanState) -> PlanState:
    new = PlanState(state.roots, state.entangled)
    new.assumed = list(state.assumed)
    new.sigma, new.atoms, new.dims = dict(state.sigma), dict(state.atoms), dict(state.dims)
    new.canon = dict(state.canon)
    new.columns, new.output = dict(state.columns), list(state.output)
    return new


def key_of(atom) -> Key:
    return (id(atom[0].find()), atom[1], atom[2])
