"""One forward's aligned tensors, kept as detached CPU copies: what `diff` compares.

Run under `_trace.opening.run_observed` (an observer, as `report/_capture.py` is), the
capture keeps per attention site Q, K and V as they enter the product (or SDPA, flex,
multi_head_attention_forward), the scores and attention weights around a softmax, the
context, and every module's output as `block`. Each is keyed by what it is: the module
path relative to the root, the role, and an occurrence index when the same module makes
the same role again (a module called twice, a shared layer).

Roles come from the op's own contract, never from sizes or names: SDPA's and flex's
`query`, `key`, `value` and output; for hand-written attention, a softmax over a
3-or-more-axis product's output is the weights (its input the scores), the product
that made them gives Q (its first operand) and K (its second, transposed back), and the
next product in the same module that takes the weights gives V and the context.

Memory is bounded: a tensor over MAX_ELEMENTS elements is not kept (it is listed in
`skipped` with its shape), nor anything once MAX_TOTAL elements are held.
"""

from dataclasses import dataclass, field
from typing import Any

from .. import _ops
from .._values import is_tensor

# Bounds: 4M elements a tensor (16 MB as float32), 64M a forward (256 MB).
MAX_ELEMENTS = 1 << 22
MAX_TOTAL = 1 << 26

_SDPA = _ops.SDPA
_FLEX = _ops.FLEX
_MHA = _ops.MHA
_SOFTMAX = _ops.by_name("softmax")
# The plain products of hand-written attention (q @ k^T, then weights @ v).
_PRODUCTS = (_ops.by_name("matmul"), _ops.by_name("bmm"))

# The named axes each role has by the op's contract ([..., L, E] for SDPA's operands).
_SDPA_AXES = {
    "Q": ("batch", "heads", "query", "head_dim"),
    "K": ("batch", "heads", "key", "head_dim"),
    "V": ("batch", "heads", "key", "head_dim"),
    "context": ("batch", "heads", "query", "head_dim"),
}
_PRODUCT_AXES = {
    "Q": ("query", "head_dim"),
    "K": ("key", "head_dim"),
    "V": ("key", "head_dim"),
    "scores": ("query", "key"),
    "attn": ("query", "key"),
    "context": ("query", "head_dim"),
}


@dataclass(slots=True)
class Captured:
    """One kept tensor: its key (`path role` + ` #n` from the second occurrence on), its
    values as a float32 CPU copy, the dtype it had, its named axes (None where the op's
    contract names none) and the user's line that made it."""

    key: str
    path: str
    role: str
    values: Any
    dtype: str
    axes: tuple[str | None, ...]
    site: str = ""  # "file:line"
    source: str = ""  # the stripped source line


@dataclass(slots=True)
class Flow:
    """The tensors one forward made, in the order they were made, and those not kept."""

    tensors: dict[str, Captured] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # "key [shape]" over the bounds
    held: int = 0  # elements kept
    # The least precise floating dtype of the model's parameters: a tensor the model
    # computes in float32 (a softmax's) still carries that dtype's rounding.
    model_dtype: str = ""

    def order(self) -> list[str]:
        return list(self.tensors)


def capture(model, args: tuple, kwargs: dict, *, aliases=None) -> tuple[Flow, Any]:
    """Run `model(*args, **kwargs)` once under an observer and module hooks; return the
    flow and the model's output. Hooks are removed also when the forward raises.
    `aliases` maps a module path to the one its tensors are keyed under (a port's
    `blocks.0.attn` to the reference's `layers.0.self_attn`)."""
    import torch

    from .._trace.opening import run_observed

    flow = Flow(model_dtype=_model_dtype(model))
    recorder = _Recorder(flow, model, aliases or {})
    handles = [
        module.register_forward_hook(recorder.block_hook(path))
        for path, module in model.named_modules()
    ]
    try:
        with torch.no_grad():
            out = run_observed(model, args, kwargs, recorder.observer)
    finally:
        for handle in handles:
            handle.remove()
    return flow, out


class _Recorder:
    """Keeps the flow's tensors; `observer(session)` is what `run_observed` is given."""

    def __init__(self, flow: Flow, root, aliases) -> None:
        self.flow = flow
        self.root = root
        self.aliases = aliases
        self.counts: dict[str, int] = {}
        self.session = None

    def observer(self, session) -> "_Observer":
        self.session = session
        return _Observer(self)

    def block_hook(self, path: str):
        def hook(module, args, out) -> None:
            tensor = _first_tensor(out)
            if tensor is not None:
                self.keep(path, "block", tensor, (None,) * tensor.dim(), _forward_site(module))

        return hook

    def keep(self, path: str, role: str, tensor, axes, site: Any = "op") -> None:
        """Copy `tensor` under `path role` (with its occurrence), within the bounds; `site`
        is the user's (file:line, source) that made it: "op" for the op being told."""
        import torch

        base = f"{self.aliases.get(path, path)} {role}".strip()
        n = self.counts.get(base, 0)
        self.counts[base] = n + 1
        key = base if n == 0 else f"{base} #{n + 1}"
        size = tensor.numel()
        if size > MAX_ELEMENTS or self.flow.held + size > MAX_TOTAL:
            self.flow.skipped.append(f"{key} {list(tensor.shape)}")
            return
        if tensor.device.type == "meta" or not tensor.is_floating_point():
            return
        with torch._C.DisableTorchFunction():
            values = tensor.detach().to("cpu", torch.float32, copy=True)
        self.flow.held += size
        location, source = _site() if site == "op" else site or ("", "")
        self.flow.tensors[key] = Captured(
            key, path, role, values, str(tensor.dtype).removeprefix("torch."), tuple(axes)
        )
        self.flow.tensors[key].site, self.flow.tensors[key].source = location, source

    def path(self) -> str:
        if self.session is None:
            return ""
        return self.session.module_description()[0]


class _Observer:
    """The observer (`_trace.observe.Observer`): finds the attention tensors of each op."""

    def __init__(self, recorder: _Recorder) -> None:
        self.recorder = recorder
        # Per module path: the last product's operands and output, and the weights a
        # softmax made there that the next product should take.
        self.products: dict[str, tuple] = {}
        self.weights: dict[str, Any] = {}

    def before(self, func, op: str, args: tuple, kwargs: dict) -> None:
        return None

    def after(self, func, op: str, args: tuple, kwargs: dict, out, count: int) -> None:
        declared = _ops.declared(op)
        if declared is None:
            return
        keep, path = self.recorder.keep, self.recorder.path()
        if declared is _SDPA or declared is _FLEX:
            bound = _ops.bind(declared, args, kwargs)
            for role, name in (("Q", "query"), ("K", "key"), ("V", "value")):
                value = bound.get(name)
                if is_tensor(value):
                    keep(path, role, value, _named(_SDPA_AXES[role], value))
            result = out[0] if isinstance(out, tuple) else out
            if is_tensor(result):
                keep(path, "context", result, _named(_SDPA_AXES["context"], result))
        elif declared is _MHA:
            result = out[0] if isinstance(out, tuple) else out
            if is_tensor(result):
                keep(path, "context", result, (None,) * result.dim())
        elif declared is _SOFTMAX:
            self._softmax(path, args, kwargs, out)
        elif declared in _PRODUCTS and len(args) >= 2:
            self._product(path, args[0], args[1], out)

    def _softmax(self, path: str, args: tuple, kwargs: dict, out) -> None:
        scores = args[0] if args else kwargs.get("input")
        if not (is_tensor(out) and is_tensor(scores)) or out.dim() < 3:
            return
        dim = _ops.bind(_SOFTMAX, args, kwargs).get("dim")
        if not isinstance(dim, int) or dim % out.dim() != out.dim() - 1:
            return  # not over the last axis: the product's contract names no key axis
        keep = self.recorder.keep
        product = self.products.pop(path, None)
        if product is not None and product[2].shape == scores.shape:
            q, k, site = product[0], product[1].transpose(-2, -1), product[3]
            keep(path, "Q", q, _named(_PRODUCT_AXES["Q"], q), site)
            keep(path, "K", k, _named(_PRODUCT_AXES["K"], k), site)
        keep(path, "scores", scores, _named(_PRODUCT_AXES["scores"], scores))
        keep(path, "attn", out, _named(_PRODUCT_AXES["attn"], out))
        self.weights[path] = out

    def _product(self, path: str, a, b, out) -> None:
        if not (is_tensor(a) and is_tensor(b) and is_tensor(out)) or a.dim() < 3 or b.dim() < 3:
            return
        weights = self.weights.get(path)
        if weights is not None and a.shape == weights.shape:
            del self.weights[path]
            keep = self.recorder.keep
            keep(path, "V", b, _named(_PRODUCT_AXES["V"], b))
            keep(path, "context", out, _named(_PRODUCT_AXES["context"], out))
            return
        self.products[path] = (a, b, out, _site())


def _named(names: tuple[str, ...], tensor) -> tuple[str | None, ...]:
    """`names` for the last axes of `tensor`; the leading axes the contract does not name
    are None (a 4-axis name list applies only to a 4-axis tensor)."""
    rank = tensor.dim()
    if len(names) == 4:
        return names if rank == 4 else (None,) * (rank - 2) + names[2:] if rank >= 2 else ()
    if rank < len(names):
        return (None,) * rank
    return (None,) * (rank - len(names)) + names


def _site() -> tuple[str, str]:
    from .._source import user_site

    site = user_site()
    return (site.location, site.source) if site is not None else ("", "")


def _model_dtype(model) -> str:
    sizes = {p.dtype: p.element_size() for p in model.parameters() if p.is_floating_point()}
    if not sizes:
        return ""
    least = min(sizes, key=lambda d: (sizes[d], str(d) != "torch.bfloat16"))
    return str(least).removeprefix("torch.")


def _forward_site(module) -> tuple[str, str]:
    """Where the module's class defines forward: the site of a block's output."""
    import linecache

    from .._source import display_path

    code = getattr(getattr(type(module), "forward", None), "__code__", None)
    if code is None:
        return "", ""
    line = linecache.getline(code.co_filename, code.co_firstlineno).strip()
    return f"{display_path(code.co_filename)}:{code.co_firstlineno}", line


def _first_tensor(value, depth: int = 0):
    """The first floating tensor in a module's output (a tuple's first, a ModelOutput's
    first field set), or None."""
    if is_tensor(value):
        return value
    if depth > 2:
        return None
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, list | tuple):
        items = value
    else:
        return None
    for item in items:
        found = _first_tensor(item, depth + 1)
        if found is not None:
            return found
    return None
