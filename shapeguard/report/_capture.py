"""`capture_attention`: attention weights of one forward, as small lists, for heatmaps.

A Trace keeps shapes, never tensors, and never will. Heatmaps need values, so
they come from a second, separate forward: `capture_attention(model, *inputs)`
runs the model once under a short-lived TorchFunctionMode of its own, copies
the attention weights of batch element 0 (detached, pooled to at most 64 x 64
per head, turned into nested lists of floats) and drops every tensor. The
result is plain data (JSON-ready) that `render_html(trace, attention=...)` draws.

What counts as attention weights:
- the output of every softmax over a tensor with 3 or more axes (Tensor.softmax,
  torch.softmax, F.softmax), over whatever axis the code chose (so a softmax
  over the wrong axis shows as columns, not rows, summing to 1);
- for F.scaled_dot_product_attention, whose kernel never shows its weights, the
  same math redone for batch element 0: softmax(q k^T * scale + mask), causal
  and GQA included;
- for nn.MultiheadAttention, the per-head weights it computes when asked
  (need_weights=True, average_attn_weights=False); the module still returns
  what its caller asked for.

Why a mode of its own, not an observer of a session (`Session.observe`, which the
probes' Watch is): the capture runs with no session and with shapeguard's checks
paused, on any callable, and a session would bring its module hooks, tensor names,
flash-attn wrapping and composite handling to a run that needs none of them. And it
changes the calls it sees: nn.MultiheadAttention's is made with other arguments and
its result rebuilt for the caller, which an observer (told of the op the session
checks and records as the user's code made it) must not do.
"""

import math
from typing import TYPE_CHECKING, TypeGuard

from .. import _ops

if TYPE_CHECKING:
    import torch

# One heatmap is at most MAX_SIZE x MAX_SIZE cells (average-pooled), at most
# MAX_HEADS heads per call and MAX_CALLS calls per forward: the report stays small.
MAX_SIZE = 64
MAX_HEADS = 16
MAX_CALLS = 8
# SDPA weights are recomputed only up to this many elements (heads * seq_q * seq_k).
RECOMPUTE_LIMIT = 1 << 24

_SOFTMAX = _ops.by_name("softmax")
# From this many positional arguments on, multi_head_attention_forward has need_weights
# by position: the capture cannot pass it again by keyword.
_MHA_NEED_WEIGHTS = _ops.MHA.params.index("need_weights")


def capture_attention(model, /, *args, **kwargs) -> dict[str, dict]:
    """Run `model(*args, **kwargs)` once and return its attention weights for batch element 0.

    Nothing is kept of the run but small lists of floats: no tensor, no hook, no
    mode outlives the call. Gradients are off, the CPU random state is restored
    afterward, and shapeguard's own checks are paused for that one run (trace the
    model separately for them). On the meta device there are no values: the
    result is empty.

    Args:
        model: an `nn.Module` or any callable.
        *args, **kwargs: its inputs.

    Returns:
        `{name: entry}` in call order, at most `MAX_CALLS` entries, where `name` is
        "module path @ file:line" and `entry` has `module` (path), `module_type`,
        `location`, `op` ("softmax", "scaled_dot_product_attention", ...), `shape` (the
        full weights' shape), `dim` (the softmax axis), `size` ([seq_q, seq_k] before
        pooling) and `heads` (one list of rows of floats per head).

    Examples:
        >>> import torch
        >>> from shapeguard.report.html import capture_attention
        >>> attn = torch.nn.MultiheadAttention(12, 3, batch_first=True)
        >>> x = torch.randn(2, 5, 12)
        >>> maps = capture_attention(attn, x, x, x)
        >>> entry = next(iter(maps.values()))
        >>> entry["shape"], len(entry["heads"]), len(entry["heads"][0]), len(entry["heads"][0][0])
        ([2, 3, 5, 5], 3, 5, 5)
    """
    import torch

    from .. import _config

    captured: dict[str, dict] = {}
    stack: list = []
    paths = (
        {id(m): name for name, m in model.named_modules()}
        if hasattr(model, "named_modules")
        else {}
    )
    mode = _new_mode(captured, stack, paths)
    hooks = torch.nn.modules.module
    handles = [
        hooks.register_module_forward_pre_hook(lambda m, a: stack.append(m)),
        hooks.register_module_forward_hook(lambda m, a, o: _pop(stack, m), always_call=True),
    ]
    try:
        with _config.disabled(), torch.no_grad(), torch.random.fork_rng(devices=[]), mode:
            model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return captured


def _pop(stack: list, module) -> None:
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is module:
            del stack[i:]
            return


def _make_mode_class():
    from torch.overrides import TorchFunctionMode

    class Mode(TorchFunctionMode):
        def __init__(self, captured: dict, stack: list, paths: dict) -> None:
            super().__init__()
            self.captured = captured
            self.stack = stack
            self.paths = paths

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if len(self.captured) >= MAX_CALLS:
                return func(*args, **kwargs)
            op = _ops.declared(_ops.name_of(func))
            if op is _SOFTMAX:
                out = func(*args, **kwargs)
                dim = _ops.bind(op, args, kwargs).get("dim")
                if isinstance(dim, int) and hasattr(out, "dim") and out.dim() >= 3:
                    self.keep(out, dim % out.dim() - out.dim(), op.name)
                return out
            if op is _ops.SDPA:
                out = func(*args, **kwargs)
                weights = _sdpa_weights(args, kwargs)
                if weights is not None:
                    self.keep(weights, -1, op.name, batched=False)
                return out
            if op is _ops.MHA:
                return self.mha(func, args, kwargs)
            return func(*args, **kwargs)

        def mha(self, func, args, kwargs):
            # nn.MultiheadAttention passes these by keyword; ask for per-head weights
            # and give the caller back what it asked for.
            wanted = kwargs.get("need_weights", True)
            average = kwargs.get("average_attn_weights", True)
            if len(args) > _MHA_NEED_WEIGHTS:
                return func(*args, **kwargs)
            out, weights = func(
                *args, **{**kwargs, "need_weights": True, "average_attn_weights": False}
            )
            if weights is not None:
                self.keep(weights, -1, _ops.MHA.name, batched=weights.dim() == 4)
            if not wanted:
                return out, None
            if average and weights is not None:
                import torch

                with torch._C.DisableTorchFunction():
                    weights = weights.mean(dim=-3)
            return out, weights

        def keep(self, weights, dim: int, op: str, batched: bool = True) -> None:
            import torch

            if weights.device.type == "meta":
                return
            with torch._C.DisableTorchFunction():
                entry = _entry(weights, dim, op, batched)
            module = self.stack[-1] if self.stack else None
            path = self.paths.get(id(module), "") if module is not None else ""
            module_type = type(module).__name__ if module is not None else ""
            from .._source import user_site

            site = user_site()
            location = site.location if site else ""
            entry.update(module=path, module_type=module_type, location=location)
            name = f"{path or module_type or 'forward'} @ {location or op}"
            key, n = name, 2
            while key in self.captured:
                key, n = f"{name} (call {n})", n + 1
            self.captured[key] = entry

    return Mode


_mode_class = None


def _new_mode(captured: dict, stack: list, paths: dict):
    # The class is made on first use: defining it needs torch, and importing this
    # module must not.
    global _mode_class
    if _mode_class is None:
        _mode_class = _make_mode_class()
    return _mode_class(captured, stack, paths)


def _entry(weights, dim: int, op: str, batched: bool) -> dict:
    """Batch element 0 of `weights`, pooled per head to at most MAX_SIZE x MAX_SIZE."""
    import torch.nn.functional as F

    shape = list(weights.shape)
    element = weights[0] if batched else weights
    if element.dim() == 2:
        element = element.unsqueeze(0)
    seq_q, seq_k = int(element.shape[-2]), int(element.shape[-1])
    maps = element.detach().reshape(-1, seq_q, seq_k)[:MAX_HEADS].float().cpu()
    pooled = F.adaptive_avg_pool2d(maps, (min(seq_q, MAX_SIZE), min(seq_k, MAX_SIZE)))
    heads = [[[round(float(v), 6) for v in row] for row in head] for head in pooled.tolist()]
    return {"op": op, "shape": shape, "dim": dim, "size": [seq_q, seq_k], "heads": heads}


def _has_dim(value) -> TypeGuard["torch.Tensor"]:  # what torch dispatches: a tensor
    return hasattr(value, "dim")


def _sdpa_weights(args: tuple, kwargs: dict):
    """softmax(q k^T * scale + mask) for batch element 0, as SDPA computes it; None if too big."""
    import torch

    p = _ops.bind(_ops.SDPA, args, kwargs)
    q, k, mask = p.get("query"), p.get("key"), p.get("attn_mask")
    if not (_has_dim(q) and _has_dim(k)) or q.dim() < 3 or q.device.type == "meta":
        return None
    with torch._C.DisableTorchFunction():
        q0 = q[0] if q.dim() == 4 else q
        k0 = k[0] if k.dim() == 4 else k
        if q0.dim() == 2:
            q0, k0 = q0.unsqueeze(0), k0.unsqueeze(0)
        heads, seq_q, seq_k = q0.shape[0], q0.shape[-2], k0.shape[-2]
        if heads * seq_q * seq_k > RECOMPUTE_LIMIT or q0.shape[-1] != k0.shape[-1]:
            return None
        if k0.shape[0] != heads:
            if not p.get("enable_gqa") or heads % k0.shape[0]:
                return None
            k0 = k0.repeat_interleave(heads // k0.shape[0], dim=0)
        scale = p.get("scale") or 1.0 / math.sqrt(q0.shape[-1])
        scores = (q0.float() @ k0.float().transpose(-2, -1)) * scale
        if p.get("is_causal"):
            keep = torch.ones(seq_q, seq_k, dtype=torch.bool, device=scores.device).tril()
            scores = scores.masked_fill(~keep, float("-inf"))
        if mask is not None and hasattr(mask, "dim"):
            m = mask[0] if mask.dim() == 4 and mask.shape[0] > 1 else mask
            while m.dim() > 3:
                m = m[0]
            try:
                if m.dtype == torch.bool:
                    scores = scores.masked_fill(~m, float("-inf"))
                else:
                    scores = scores + m.float()
            except RuntimeError:
                return None
        return scores.softmax(dim=-1).nan_to_num(0.0)
