"""The reference's weights given to the port for one comparison, and what was matched.

`match` pairs the port's parameters with the reference's: first the user's mapping
({ref_name: port_name}), then the same state-dict names, then the rest by matching
shapes in module order (each port parameter takes the first unmatched reference
parameter of its shape). Persistent buffers follow by name only. Nothing is copied
silently in part: what either side has left over is listed in the report.

`lent` copies the matched values into the port for the block and puts the port's own
values back afterwards, also on an error; the reference is only read.
"""

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field


class WeightsError(ValueError):
    """A mapping that cannot be applied (an unknown name, shapes that differ)."""


@dataclass(slots=True)
class Matched:
    """The weights matched for one comparison: `pairs` as (ref_name, port_name, how) with
    how in "mapping", "name", "shape"; the parameters of each side left unmatched."""

    mode: str  # "copy", "none", "mapping" or "same model"
    pairs: list[tuple[str, str, str]] = field(default_factory=list)
    ref_unmatched: list[str] = field(default_factory=list)
    port_unmatched: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out = {"mapping": 0, "name": 0, "shape": 0}
        for _, _, how in self.pairs:
            out[how] += 1
        return out

    def summary(self) -> str:
        if self.mode == "same model":
            return "weights: the same model on both sides"
        if self.mode == "none":
            return "weights: none copied (weights='none')"
        c = self.counts()
        made = ", ".join(f"{n} by {how}" for how, n in c.items() if n) or "none"
        line = f"weights: {len(self.pairs)} tensors copied from the reference ({made})"
        if self.ref_unmatched or self.port_unmatched:
            line += (
                f"; unmatched: {len(self.ref_unmatched)} of the reference's "
                f"({_listed(self.ref_unmatched)}), {len(self.port_unmatched)} of the port's "
                f"({_listed(self.port_unmatched)})"
            )
        return line

    def as_json(self) -> dict:
        return {
            "mode": self.mode,
            "pairs": [{"ref": r, "port": p, "how": how} for r, p, how in self.pairs],
            "ref_unmatched": list(self.ref_unmatched),
            "port_unmatched": list(self.port_unmatched),
        }


def _listed(names: list[str], limit: int = 4) -> str:
    if not names:
        return "-"
    shown = ", ".join(names[:limit])
    return shown + (f", ... {len(names) - limit} more" if len(names) > limit else "")


def match(ref, port, weights) -> Matched:
    """Pair the port's parameters (and persistent buffers, by name) with the reference's.

    Args:
        weights: "copy", "none", or a mapping {ref_name: port_name} tried first.

    Raises:
        WeightsError: a mapped name either side lacks, or mapped shapes that differ.
    """
    if isinstance(weights, str) and weights not in ("copy", "none"):
        raise WeightsError(f"weights={weights!r}: give 'copy', 'none' or a mapping")
    if weights == "none":
        return Matched("none")
    mode = "copy" if isinstance(weights, str) else "mapping"
    ref_params = dict(ref.named_parameters())
    port_params = dict(port.named_parameters())
    matched = Matched(mode)
    taken_ref: set[str] = set()
    taken_port: set[str] = set()

    def take(r: str, p: str, how: str) -> None:
        matched.pairs.append((r, p, how))
        taken_ref.add(r)
        taken_port.add(p)

    if isinstance(weights, Mapping):
        ref_state, port_state = _state(ref), _state(port)
        for r, p in weights.items():
            if r not in ref_state:
                raise WeightsError(f"weights mapping: the reference has no tensor {r!r}")
            if p not in port_state:
                raise WeightsError(f"weights mapping: the port has no tensor {p!r}")
            if ref_state[r].shape != port_state[p].shape:
                raise WeightsError(
                    f"weights mapping: {r} {list(ref_state[r].shape)} != "
                    f"{p} {list(port_state[p].shape)} in the port"
                )
            take(r, p, "mapping")
    for name, param in port_params.items():
        other = ref_params.get(name)
        fresh = name not in taken_port and name not in taken_ref
        if fresh and other is not None and other.shape == param.shape:
            take(name, name, "name")
    rest = [r for r in ref_params if r not in taken_ref]
    for name, param in port_params.items():
        if name in taken_port:
            continue
        for r in rest:
            if r not in taken_ref and ref_params[r].shape == param.shape:
                take(r, name, "shape")
                break
    ref_buffers, port_buffers = _buffers(ref), _buffers(port)
    for name, buffer in port_buffers.items():
        other = ref_buffers.get(name)
        if name not in taken_port and other is not None and other.shape == buffer.shape:
            take(name, name, "name")
    matched.ref_unmatched = [r for r in ref_params if r not in taken_ref]
    matched.port_unmatched = [p for p in port_params if p not in taken_port]
    return matched


def _buffers(module) -> dict:
    state = module.state_dict(keep_vars=True)
    params = dict(module.named_parameters())
    return {n: t for n, t in state.items() if n not in params}


def _state(module) -> dict:
    return dict(module.state_dict(keep_vars=True))


@contextlib.contextmanager
def lent(ref, port, matched: Matched) -> Iterator[None]:
    """The port holds the reference's matched values in the block, its own again after."""
    import torch

    if not matched.pairs:
        yield
        return
    ref_state, port_state = _state(ref), _state(port)
    saved = []
    with torch.no_grad():
        try:
            for r, p, _ in matched.pairs:
                target = port_state[p]
                saved.append((target, target.detach().clone()))
                target.copy_(ref_state[r].detach().to(target.dtype))
            yield
        finally:
            for target, value in saved:
                target.copy_(value)


def module_aliases(matched: Matched) -> dict[str, str]:
    """{port module path: reference module path} read from the weights matched by a
    mapping or by shape (names that agree need none): `blocks.0.attn.wq` for
    `layers.0.self_attn.q_proj` gives `blocks.0.attn.wq` -> `...q_proj` and, while
    consistent, each parent to its parent. Conflicting paths are dropped."""
    found: dict[str, str] = {}
    conflicts: set[str] = set()
    for r, p, _ in matched.pairs:
        ref_parts, port_parts = r.split(".")[:-1], p.split(".")[:-1]
        while ref_parts and port_parts:
            port_path, ref_path = ".".join(port_parts), ".".join(ref_parts)
            if found.get(port_path, ref_path) != ref_path:
                conflicts.add(port_path)
            found[port_path] = ref_path
            ref_parts, port_parts = ref_parts[:-1], port_parts[:-1]
    return {p: r for p, r in found.items() if p not in conflicts and p != r}
