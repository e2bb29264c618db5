"""SDPA, F.multi_head_attention_forward, and torch's attention modules recorded whole."""

from ... import _ops
from ..._values import is_tensor
from .. import dims as D
from ..dims import BATCH, FEATURE, TOKEN
from .base import Made, claim_axis, fallback_axes, propagates


@propagates(_ops.ATTENTION)
def _attention(call, outputs):
    bound = _ops.bind(call.spec, call.args, call.kwargs)
    q, k, v = bound.get("query"), bound.get("key"), bound.get("value")
    if not (is_tensor(q) and is_tensor(k) and is_tensor(v)):
        return None
    qm, km, vm = call.meta_of(q), call.meta_of(k), call.meta_of(v)
    for meta, role in ((qm, "Q"), (km, "K"), (vm, "V")):
        if meta.role is None:
            meta.role = role
    if call.spec is _ops.SDPA or call.spec is _ops.FLEX:  # both [batch, heads, seq, d_k]
        return _sdpa(q, k, v, qm, km, vm, outputs, learn=not call.reported)
    return _mha(q, k, qm, km, vm, outputs, learn=not call.reported)


def _sdpa(q, k, v, qm, km, vm, outputs, learn: bool = True):
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim():
        return None
    dims = (*qm.dims[:-1], vm.dims[-1])
    made = [Made(dims, qm.tags[:-1] + (None,) if qm.tags else (), "context")]
    if not learn:
        return made
    claim_axis(qm.dims[-1], FEATURE, "d_k")
    claim_axis(km.dims[-1], FEATURE, "d_k")
    claim_axis(qm.dims[-2], TOKEN, "seq", side="q")
    claim_axis(km.dims[-2], TOKEN, "seq", side="k")
    if k.shape[-2] == v.shape[-2] and k.shape[-2] > 1:
        D.line_up(km.dims[-2], vm.dims[-2])
    if q.dim() >= 4:
        kv = "kv_heads" if k.shape[-3] < q.shape[-3] else "heads"
        claim_axis(qm.dims[-3], FEATURE, "heads")
        claim_axis(km.dims[-3], FEATURE, kv)
        claim_axis(vm.dims[-3], FEATURE, kv)
    if q.dim() >= 3:
        for meta in (qm, km, vm):
            if len(meta.dims[0]) == 1:
                claim_axis(meta.dims[0], BATCH)
    dims = (*qm.dims[:-1], vm.dims[-1])
    return [Made(dims, qm.tags[:-1] + (None,) if qm.tags else (), "context")]


def _mha(q, k, qm, km, vm, outputs, learn: bool = True):
    if q.dim() not in (2, 3) or k.dim() != q.dim():
        return None
    made = [Made(qm.dims)]
    for extra in outputs[1:]:
        if q.dim() == 3 and extra.dim() >= 3:
            dims = (qm.dims[1], *([()] * (extra.dim() - 3)), qm.dims[0], km.dims[0])
        else:
            dims = D.fresh_axes(tuple(extra.shape))
        made.append(Made(tuple(dims), (), "attn"))
    if learn:
        claim_axis(qm.dims[0], TOKEN, side="q")
        claim_axis(km.dims[0], TOKEN, side="k")
        if len(vm.dims) == k.dim() and km.dims[0] and vm.dims[0]:
            D.line_up(km.dims[0], vm.dims[0])  # key i and value i are one position
        if q.dim() == 3:
            for meta in (qm, km, vm):
                claim_axis(meta.dims[1], BATCH)
    return made


# -- torch's attention modules, recorded whole --------------------------------------------------
def _batch_first(module) -> bool:
    """The layout a torch attention module reads, from itself or its attention layers."""
    for candidate in (
        module,
        getattr(module, "self_attn", None),
        *(getattr(layer, "self_attn", None) for layer in getattr(module, "layers", ())[:1]),
        *(
            getattr(layer, "self_attn", None)
            for part in (getattr(module, "encoder", None),)
            for layer in getattr(part, "layers", ())[:1]
        ),
    ):
        flag = getattr(candidate, "batch_first", None)
        if isinstance(flag, bool):
            return flag
    return False


@propagates(_ops.COMPOSITE)
def _composite(call, outputs):
    """nn.MultiheadAttention and the nn.Transformer* layers: their documented layout
    ([batch, seq, d_model] with batch_first, else [seq, batch, d_model]) names the axes
    of every 3-D input; each output has the axes of the input of its shape (the query,
    or the target of nn.Transformer)."""
    module = call.module
    batch_first = _batch_first(module) if module is not None else False
    tensors = [t for t in call.tensors() if t.is_floating_point() and t.dim() == 3]
    metas = [call.meta_of(t) for t in tensors]
    is_mha = call.spec.name == "MultiheadAttention"
    for index, meta in enumerate(metas):
        seq, batch = (1, 0) if batch_first else (0, 1)
        side = ("q" if index == 0 else "k") if is_mha else ""
        claim_axis(meta.dims[seq], TOKEN, side=side)
        claim_axis(meta.dims[batch], BATCH)
        claim_axis(meta.dims[2], FEATURE)
    if is_mha and len(metas) >= 3:
        seq = 1 if batch_first else 0
        if tensors[1].shape[seq] == tensors[2].shape[seq] > 1:
            D.line_up(metas[1].dims[seq], metas[2].dims[seq])  # key i and value i: one position
    made = []
    for out in outputs:
        source = None
        candidates = list(zip(tensors, metas, strict=True))
        if call.spec.name == "Transformer" and len(candidates) >= 2:
            candidates = [candidates[1], candidates[0]]  # the output is the target's
        for t, m in candidates:
            if tuple(t.shape) == tuple(out.shape):
                source = m
                break
        if source is not None:
            made.append(Made(source.dims))
        elif is_mha and tensors and out.dim() >= 3:
            q, k = metas[0], metas[-1]
            seq, batch = (1, 0) if batch_first else (0, 1)
            dims = (q.dims[batch], *([()] * (out.dim() - 3)), q.dims[seq], k.dims[seq])
            made.append(Made(tuple(dims), (), "attn"))
        else:
            made.append(fallback_axes(call, out))
    return made
