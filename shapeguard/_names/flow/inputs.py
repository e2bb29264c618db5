"""Where axes come in: new tensors, embeddings of token ids, convolutions over images and audio."""

import re

from ... import _ops
from ..._values import is_tensor
from .. import dims as D
from ..dims import BATCH, FEATURE, STRUCTURE, TOKEN
from .base import Made, first_tensor, propagates


@propagates(_ops.FACTORY)
def _factory(call, outputs):
    rotary = call.spec.rotary
    return [Made(D.fresh_axes(tuple(o.shape), origin=call.op), rotary=rotary) for o in outputs]


@propagates(_ops.EMBEDDING)
def _embedding(call, outputs):
    bound = _ops.bind(call.spec, call.args, call.kwargs)
    ids, w = bound.get("input"), bound.get("weight")
    if not (is_tensor(ids) and is_tensor(w)) or w.dim() != 2:
        return None
    im, wm = call.meta_of(ids), call.meta_of(w)
    width = wm.dims[1]
    D.claim_atoms(width, FEATURE, D.PARAM)
    declared = call.declared()
    for axis, names in (("d_model", "d_model"), ("heads", "heads")):
        hit = declared.get(axis)
        if hit is not None and hit[1] == w.shape[1] and len(width) == 1:
            D.claim_part(width[0], names, D.DECLARED)
            break
    if ids.dim() == 1 and ids.numel() > 1:
        # Ids an arange made are positions by structure; other 1-D ids are one sequence's
        # tokens by the usual layout, or a batch of class labels (DiT's label embedding).
        made_by = _ops.lookup(im.op) if im.op else None
        positions = made_by is not None and made_by.positional
        D.claim_atoms(im.dims[0], TOKEN, STRUCTURE if positions else D.CONVENTION)
    return [Made((*im.dims, width), im.tags + (None,) if im.tags else ())]


# A 1-D conv runs along a sequence (audio frames, a causal conv's tokens).
_SPATIAL = {1: ("seq",), 2: ("height", "width"), 3: ("depth", "height", "width")}


def _im2col(call, outputs):
    """F.unfold: [N, C, H, W] -> [N, C * kh * kw, L], the L patch positions last."""
    x = first_tensor(call)
    out = outputs[0]
    if x is None or x.dim() != 4 or out.dim() != 3:
        return None
    xm = call.meta_of(x)
    channels = xm.dims[1]
    D.claim_atoms(
        channels, FEATURE, STRUCTURE, "channels" if D.known_name(channels) is None else None
    )
    for axis, name in ((xm.dims[2], "height"), (xm.dims[3], "width")):
        D.claim_atoms(axis, TOKEN, STRUCTURE, name if D.known_name(axis) is None else None)
    kernel = int(out.shape[1]) // max(D.size_of(channels), 1)
    features = D.normalize(
        (
            *channels,
            *D.fresh(kernel, kind=FEATURE, kind_rank=STRUCTURE, origin="unfold kernel positions"),
        )
    )
    if _one_patch_per_position(call, x):
        # Stride 1, padded to keep the grid: patch l is centred on position l (row-major),
        # so the patches are the input's positions (ConvBERT's span convolution).
        patches = D.normalize((*xm.dims[2], *xm.dims[3]))
    else:
        patches = D.fresh(
            int(out.shape[2]),
            name="seq",
            rank=STRUCTURE,
            kind=TOKEN,
            kind_rank=STRUCTURE,
            origin="unfold patches",
        )
    return [Made((xm.dims[0], features, patches))]


def _one_patch_per_position(call, x) -> bool:
    """F.unfold with stride 1 whose padding keeps both spatial sizes."""
    bound = _ops.bind(call.spec, call.args, call.kwargs)

    def pair(name, default):
        value = bound.get(name, default)
        value = (value, value) if isinstance(value, int) else tuple(value)
        return value if len(value) == 2 and all(isinstance(v, int) for v in value) else None

    kernel, dilation = pair("kernel_size", None), pair("dilation", 1)
    padding, stride = pair("padding", 0), pair("stride", 1)
    if None in (kernel, dilation, padding, stride) or stride != (1, 1):
        return False
    return all(p * 2 == d * (k - 1) for k, d, p in zip(kernel, dilation, padding, strict=True))


def _pool(call, outputs):
    """Pooling ([batch, channels, *spatial] or [channels, *spatial], the spatial count in
    its name): each example's channels pooled on their own, so the leading axes keep
    their identity; the pooled positions are new (a window of positions mixed into
    one, with no weight to say where it is wider than one)."""
    x = first_tensor(call)
    counted = re.search(r"pool(\d)d", call.spec.name)
    spatial = int(counted.group(1)) if counted else 0
    if x is None or not spatial or x.dim() not in (spatial + 1, spatial + 2):
        return None
    if any(tuple(o.shape[: x.dim() - spatial]) != tuple(x.shape[:-spatial]) for o in outputs):
        return None
    xm = call.meta_of(x)
    lead = xm.dims[: x.dim() - spatial]
    made = []
    for out in outputs:
        sizes = [int(n) for n in out.shape[x.dim() - spatial :]]
        places = tuple(D.fresh(n, origin=f"{call.op} positions") for n in sizes)
        made.append(Made((*lead, *places)))
    return made


@propagates(_ops.CONV)
def _conv(call, outputs):
    if call.spec.name == "unfold":
        return None if call.is_method else _im2col(call, outputs)
    if "pool" in call.spec.name:
        return _pool(call, outputs)
    bound = _ops.bind(call.spec, call.args, call.kwargs)
    x, w = bound.get("input"), bound.get("weight")
    if not (is_tensor(x) and is_tensor(w)):
        return None
    spatial = w.dim() - 2
    out = outputs[0]
    if x.dim() not in (spatial + 1, spatial + 2) or out.dim() != x.dim():
        return None
    xm, wm = call.meta_of(x), call.meta_of(w)
    lead = x.dim() - spatial - 1  # 1 with a batch axis, 0 without
    if lead:
        # A conv reads [batch, channels, *spatial] (its documented layout): the first axis
        # holds the examples, each convolved on its own. A fold there ([batch * frames],
        # a video's clips run frame by frame) says only that its items are apart, not that
        # each factor is the model's batch: attention may run along one of them next.
        lead_axis = xm.dims[0]
        D.claim_atoms(lead_axis, BATCH, STRUCTURE if len(lead_axis) <= 1 else D.CONVENTION)
    channels = xm.dims[lead]
    # The kind first: a conventional name of another kind (audio's mel bins read as seq)
    # goes with it, and the conv's own name comes in its place.
    D.claim_atoms(channels, FEATURE, STRUCTURE)
    if D.known_name(channels) is None:
        D.claim_atoms(channels, FEATURE, STRUCTURE, "channels")
    D.claim_atoms(wm.dims[0], FEATURE, D.PARAM)
    out_channels = wm.dims[0]
    declared = call.declared().get("d_model")
    if declared is not None and declared[1] == w.shape[0] and len(out_channels) == 1:
        D.claim_part(out_channels[0], "d_model", D.DECLARED)
    elif len(out_channels) == 1:
        D.claim_part(out_channels[0], "channels", D.PARAM)
    axes = [*xm.dims[:lead], out_channels]
    names = _SPATIAL.get(spatial, (None,) * spatial)
    for i in range(spatial):
        src = xm.dims[lead + 1 + i]
        name = names[i]
        D.claim_atoms(src, TOKEN, STRUCTURE)
        if D.known_name(src) is None and name is not None:
            D.claim_atoms(src, TOKEN, STRUCTURE, name)
        size = int(out.shape[lead + 1 + i])
        if size == D.size_of(src):
            axes.append(src)
        else:
            # Strided: new positions, read from the old ones (patches, frames).
            keep = D.known_name(src)
            axes.append(
                D.fresh(
                    size,
                    name=keep or name,
                    rank=STRUCTURE if (keep or name) else 0,
                    kind=TOKEN,
                    kind_rank=STRUCTURE,
                    origin=f"{call.op} positions",
                )
            )
    return [Made(tuple(axes))]
