"""`capture_attention`: attention weights of one forward, as small lists, for heatmaps.

A Trace keeps shapes, never tensors, and never will. Heatmaps need values, so
they come from a second, separate forward: `capture_attention(model, *inputs)`
runs the model once in a session of its own with shapeguard's checks off, whose
observer (`Session.observe`, as the probes' Watch is) copies the attention
weights of batch element 0 (detached, pooled to at most 64 x 64 per head,
turned into nested lists of floats) and drops every tensor. The result is plain
data (JSON-ready) that `render_html(trace, attention=...)` draws.

What counts as attention weights:
- the output of every softmax over a tensor with 3 or more axes (Tensor.softmax,
  torch.softmax, F.softmax), over whatever axis the code chose (so a softmax
  over the wrong axis shows as columns, not rows, summing to 1);
- for F.scaled_dot_product_attention, whose kernel never shows its weights, the
  same math redone for batch element 0: softmax(q k^T * scale + mask), causal
  and GQA included;
- for nn.MultiheadAttention, the per-head weights of its call made once more
  after it (need_weights=True, average_attn_weights=False, the random state its
  call started from, so dropout drops the same weights).

An observer never changes a call: every op runs as the model made it, so the
captured forward computes what an unobserved one does (nn.MultiheadAttention
asked for no weights keeps the SDPA path it then takes), and the weights come
from copies.
"""

import math
from typing import TYPE_CHECKING

from .. import _ops
from .._values import is_tensor

if TYPE_CHECKING:
    pass

# One heatmap is at most MAX_SIZE x MAX_SIZE cells (average-pooled), at most
# MAX_HEADS heads per call and MAX_CALLS calls per forward: the report stays small.
MAX_SIZE = 64
MAX_HEADS = 16
MAX_CALLS = 8
# SDPA weights are recomputed only up to this many elements (heads * seq_q * seq_k).
RECOMPUTE_LIMIT = 1 << 24

_SOFTMAX = _ops.by_name("softmax")


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

    from .._trace.opening import run_observed

    captured: dict[str, dict] = {}
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        run_observed(model, args, kwargs, lambda session: _Capture(session, captured))
    return captured


class _Capture:
    """The observer (`_trace.observe.Observer`): keeps the weights of the ops above."""

    def __init__(self, session, captured: dict) -> None:
        self.session = session
        self.captured = captured
        self._rng = None  # the random state an nn.MultiheadAttention call started from

    def before(self, func, op: str, args: tuple, kwargs: dict) -> None:
        if _ops.declared(op) is _ops.MHA and len(self.captured) < MAX_CALLS:
            self._rng = _random_state(_ops.bind(_ops.MHA, args, kwargs))

    def after(self, func, op: str, args: tuple, kwargs: dict, out, count: int) -> None:
        if len(self.captured) >= MAX_CALLS:
            return
        declared = _ops.declared(op)
        if declared is _SOFTMAX:
            dim = _ops.bind(declared, args, kwargs).get("dim")
            if isinstance(dim, int) and is_tensor(out) and out.dim() >= 3:
                self.keep(out, dim % out.dim() - out.dim(), declared.name)
        elif declared is _ops.SDPA:
            weights = _sdpa_weights(args, kwargs)
            if weights is not None:
                self.keep(weights, -1, declared.name, batched=False)
        elif declared is _ops.MHA:
            rng, self._rng = self._rng, None
            weights = _mha_weights(func, args, kwargs, rng)
            if weights is not None:
                self.keep(weights, -1, declared.name, batched=weights.dim() == 4)

    def keep(self, weights, dim: int, op: str, batched: bool = True) -> None:
        import torch

        if weights.device.type == "meta":
            return
        with torch._C.DisableTorchFunction():
            entry = _entry(weights, dim, op, batched)
        path, module_type, _ = self.session.module_description()
        from .._source import user_site

        site = user_site()
        location = site.location if site else ""
        entry.update(module=path, module_type=module_type, location=location)
        name = f"{path or module_type or 'forward'} @ {location or op}"
        key, n = name, 2
        while key in self.captured:
            key, n = f"{name} (call {n})", n + 1
        self.captured[key] = entry


def _random_state(bound: dict):
    """The generator states a dropout in this call reads: (device, CPU state, its CUDA
    state), or None when the call drops nothing."""
    import torch

    if not bound.get("training", True) or not bound.get("dropout_p"):
        return None
    query = bound.get("query")
    device = query.device if is_tensor(query) else torch.device("cpu")
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return device, torch.get_rng_state(), cuda


def _mha_weights(func, args: tuple, kwargs: dict, rng):
    """The per-head weights of a multi_head_attention_forward call, from the same call
    made again, by keyword, asking for them; the caller's call and result are untouched."""
    import torch

    bound = _ops.bind(_ops.MHA, args, kwargs)
    bound.update(need_weights=True, average_attn_weights=False)
    devices = [rng[0]] if rng is not None and rng[0].type == "cuda" else []
    with torch._C.DisableTorchFunction(), torch.random.fork_rng(devices=devices):
        if rng is not None:
            device, cpu, cuda = rng
            torch.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state(cuda, device)
        try:
            _, weights = func(**bound)
        except (RuntimeError, TypeError, ValueError):
            return None  # the call failed as the model made it, or takes other arguments
    return weights


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


def _sdpa_weights(args: tuple, kwargs: dict):
    """softmax(q k^T * scale + mask) for batch element 0, as SDPA computes it; None if too big."""
    import torch

    p = _ops.bind(_ops.SDPA, args, kwargs)
    q, k, mask = p.get("query"), p.get("key"), p.get("attn_mask")
    if not (is_tensor(q) and is_tensor(k)) or q.dim() < 3 or q.device.type == "meta":
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
        if is_tensor(mask):
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
