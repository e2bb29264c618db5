"""Whether the outputs the probes compare depend on the attention at all.

A probe passes when the edited run leaves the outputs where they were. Where the
attention's result never reaches them (an output projection initialised to zero, as
diffusion U-Nets' `zero_module` and DiT's adaLN-Zero start; a gate at zero), every
deviation is 0 whatever the attention does, and a pass says nothing about it. One run
adds noise to the output of every attention op (SDPA's, flash attention's, or a product
that reads softmax weights: the context); where no compared output moves, the passes
are inconclusive.
Where the run finds no attention op, nothing is said. Where the outputs are deaf, the
same noise finds where the attention's effect stops (`live_points`): the probes then
measure there instead (`inner.py`).
"""

from dataclasses import dataclass

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from .. import _ops
from .._source import user_site
from .compare import deviation, scale_of
from .subject import Subject
from .tree import first_output, pick

# The ops whose output is attention weights (the op table's softmax step).
_SOFTMAX = _ops.spellings_where(step="softmax")
_ATTENTION = (_ops.ATTENTION, _ops.FLASH)


class _Noise:
    """An observer of one forward (`_trace.opening.run_observed`) that adds noise of its
    own scale to each attention op's output, in place (a private copy's forward, under
    no_grad). Softmax weights are followed through whatever reads them (masking, dropout,
    casts, views) to the product with V."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator
        self.hits = 0
        self.sites: list[str] = []  # the lines of the attention ops it shook (the first 3)
        self.weights = WeakTensorKeyDictionary()  # softmax outputs and what follows them

    def before(self, func, op: str, args, kwargs) -> None:
        pass

    def after(self, func, op: str, args, kwargs, out, count: int) -> None:
        first = out[0] if isinstance(out, tuple | list) and out else out
        if not isinstance(first, torch.Tensor) or not first.is_floating_point():
            return
        family = _ops.lookup(op).family
        reads = any(_is_weights(self.weights, a) for a in (*args, *kwargs.values()))
        if op in _SOFTMAX:
            self.weights[first] = True
        elif family in _ATTENTION or (reads and family == _ops.PRODUCT):
            self._shake(first)
        elif reads:
            self.weights[first] = True

    def _shake(self, t: torch.Tensor) -> None:
        if not t.numel():
            return
        finite = t[torch.isfinite(t)]
        scale = float(finite.abs().max()) if finite.numel() else 1.0
        noise = torch.randn(t.shape, generator=self.generator, dtype=torch.float64)
        t.add_(noise.to(t.dtype).to(t.device) * (scale or 1.0))
        self.hits += 1
        site = user_site()
        said = f"{site.location} `{site.source}`" if site is not None else ""
        if said and said not in self.sites and len(self.sites) < 3:
            self.sites.append(said)  # each line once: a layer's op runs once per layer


def _is_weights(table, value) -> bool:
    if isinstance(value, torch.Tensor):
        return value in table
    if isinstance(value, list | tuple):
        return any(isinstance(v, torch.Tensor) and v in table for v in value)
    return False


def deaf(s: Subject) -> str:
    """Why the compared outputs do not depend on the attention ("" where they do, or
    where no attention op was found to test it with)."""
    from .._trace.opening import run_observed

    leaves = [leaf for leaf in s.layout.outputs if leaf.path in s.refs]
    if not leaves:
        return ""
    args, kwargs = s.inputs
    noise = _Noise(torch.Generator().manual_seed(0))
    out = run_observed(s.model, args, kwargs, lambda session: noise)
    if not noise.hits:
        return ""
    got = {leaf.path: pick(out, leaf.path) for leaf in leaves}
    dev = s.measure(got, s.refs, leaves)
    if dev > s.rtol:
        return ""
    ops = "op" if noise.hits == 1 else "ops"
    at = f" ({'; '.join(noise.sites)})" if noise.sites else ""
    return (
        f"the output does not depend on the attention: noise added to the output of "
        f"{noise.hits} attention {ops}{at} left it unchanged (deviation {dev:.1e}), so no "
        f"probe of the output can see what the attention does ({cut_off(s.model)})"
    )


def cut_off(model: torch.nn.Module) -> str:
    """What cuts the attention off, as far as the weights show it."""
    zeros = zero_weights(model)
    if zeros:
        return f"all-zero weights: {zeros}, as zero_module and adaLN-Zero start"
    return "an output projection or a gate at zero, as zero_module and adaLN-Zero start"


def zero_weights(model: torch.nn.Module, most: int = 3) -> str:
    """The names of the parameters other than biases that are all zero (the first `most`,
    then a count): the structure that cuts the attention off, where it is a weight (a
    norm's bias starts at zero in every model, and says nothing)."""
    names = [
        n
        for n, p in model.named_parameters()
        if p.numel() and not n.endswith("bias") and not bool(p.any())
    ]
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


@dataclass(frozen=True, slots=True)
class Point:
    """A module's input or output that the attention moves, where the probes can measure
    what the block's deaf output cannot show."""

    path: str  # the module's path in the model ("" is the model itself)
    side: str  # "input" (the tensor the module was called with) or "output"
    what: str  # the module's class name
    site: str  # where it was called: file:line `source`, or ""


def live_points(s: Subject, most: int = 16) -> list[Point]:
    """Where the attention's effect stops: the input of each module whose first input the
    attention noise moves and whose output it does not (a zero projection, a gate); where
    there is none, the outermost module outputs it moves. Empty where nothing moves."""
    from .._trace.opening import run_observed

    args, kwargs = s.inputs
    clean, noisy = _Seen(s.model), _Seen(s.model)
    with clean:
        s.model(*args, **kwargs)
    noise = _Noise(torch.Generator().manual_seed(0))
    with noisy:
        run_observed(s.model, args, kwargs, lambda session: noise)

    def moved(key) -> bool:
        a, b = noisy.seen.get(key), clean.seen.get(key)
        if a is None or b is None or a.shape != b.shape or not bool(torch.isfinite(b).all()):
            return False
        return deviation(a, b, scale_of(b)) > s.rtol and bool((b != b.flatten()[0]).any())

    paths = [p for p in clean.order if p]
    stops = [p for p in paths if moved((p, "input")) and not moved((p, "output"))]
    if stops:
        chosen = [(p, "input") for p in stops]
    else:
        outer = [p for p in paths if moved((p, "output"))]
        chosen = [(p, "output") for p in outer if not any(_inside(p, q) for q in outer)]
    modules = dict(s.model.named_modules())
    return [
        Point(p, side, type(modules[p]).__name__, clean.sites.get(p, ""))
        for p, side in chosen[:most]
    ]


def _inside(path: str, other: str) -> bool:
    return path != other and path.startswith(other + ".")


class _Seen:
    """Hooks on every submodule that keep a copy of the first floating tensor of its
    first call's input and output, with where it was called; removed on exit."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.seen: dict = {}
        self.order: list[str] = []
        self.sites: dict[str, str] = {}
        self.handles: list = []

    def __enter__(self) -> "_Seen":
        for path, module in self.model.named_modules():
            self.handles.append(
                module.register_forward_pre_hook(self._before(path), with_kwargs=True)
            )
            self.handles.append(module.register_forward_hook(self._after(path)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def _keep(self, key, value) -> None:
        t = first_output(value)
        if key not in self.seen and t is not None:
            self.seen[key] = t.detach().clone()

    def _before(self, path: str):
        def hook(module, args, kwargs):
            if path not in self.sites:
                self.order.append(path)
                site = user_site()
                self.sites[path] = f"{site.location} `{site.source}`" if site else ""
            self._keep((path, "input"), (args, kwargs))

        return hook

    def _after(self, path: str):
        def hook(module, args, out):
            self._keep((path, "output"), out)

        return hook
