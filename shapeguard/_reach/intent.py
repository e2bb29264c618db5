"""The intent that can be established for one attention site, each part with its evidence.

Read from what the model states, never from sizes: the root's inputs as its API names
them (`attention_mask`, 1 = real, as transformers takes it; `key_padding_mask`, True =
padding, as torch's modules do; `position_ids` that restart within a row; `cu_seqlens`;
`document_ids`), the attention module's own declarations (`is_causal = True`,
`sliding_window`, `layer_idx`) and its config's (`layer_types`; causality from the config's
flags or a sibling layer's triangle where the module says nothing: `model_causal`). An input is tied to the
site's axes by provenance (`_names/dims.py`): the site's key axis is the input's sequence
axis, or the sequence axis of the main input it is documented beside (`input_ids`), or a
slice of one (`checks/_own_keys.py` follows the cuts). Where nothing ties them, that
part of the intent is unknown and no claim is made.

The root's inputs are held weakly for the forward (`RootInputs`); what is read of them
is plain data (runs, ints), cached on that forward's `RootInputs`, never a tensor.
"""

import re
import weakref
from dataclasses import dataclass
from typing import Any

from .. import _ops
from ..checks._own_keys import own_keys
from . import model_causal
from .rows import Runs
from .steps import own_at_step, padding_at_step

# A mask beside a main input: (mask name, main input names, True where the mask's value
# says padding). transformers' masks hold 1 for a real token; torch's hold True for padding.
_PADDING = (
    ("attention_mask", ("input_ids", "inputs_embeds"), False),
    ("decoder_attention_mask", ("decoder_input_ids", "decoder_inputs_embeds"), False),
    ("key_padding_mask", ("key", "value"), True),
    ("src_key_padding_mask", ("src",), True),
    ("tgt_key_padding_mask", ("tgt",), True),
    ("memory_key_padding_mask", ("memory",), True),
)
_POSITIONS = ("position_ids",)
_DOCUMENTS = ("document_ids", "doc_ids", "seq_ids", "sequence_ids")
_CU_SEQLENS = ("cu_seqlens", "cu_seq_lens_q", "cu_seq_lens_k", "cu_seqlens_q", "cu_seqlens_k")
# Inputs that say some tokens may see later ones (image tokens, a prefix): Gemma 3 and
# PaliGemma attend bidirectionally inside such spans of a causal decoder.
_BIDIRECTIONAL = ("token_type_ids", "mm_token_type_ids", "pixel_values", "pixel_values_videos")
# Values read from an input at most (a [batch, seq] mask of a long batch is far below).
_MAX_READ = 1 << 22
# The ops whose scores are the input's last two axes (the reach's softmax sites).
SOFTMAXES = (_ops.by_name("softmax"), _ops.by_name("log_softmax"))
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


class RootInputs:
    """The root's named inputs of one forward, held weakly, and what `intent` read of
    them (plain data, by question) so each forward reads each input once."""

    __slots__ = ("_refs", "read")

    def __init__(self, named: list) -> None:
        refs = []
        for name, tensor in named:
            try:
                refs.append((name, weakref.ref(tensor)))
            except TypeError:
                continue
        self._refs = tuple(refs)
        self.read: dict[Any, Any] = {}

    def get(self, name: str):
        """The live input named `name` (the last part of a nested label), or None."""
        for label, ref in self._refs:
            if label == name or label.endswith("." + name):
                return ref()
        return None

    def names(self) -> tuple[str, ...]:
        return tuple(label.rsplit(".", 1)[-1] for label, ref in self._refs if ref() is not None)


@dataclass(frozen=True, slots=True)
class Padding:
    """Which keys are padding at the site, per example (None: the same for all)."""

    keys: tuple[tuple[bool, ...], ...]  # per example (1 row if alike), True = padding
    queries: tuple[tuple[bool, ...], ...] | None  # the same for the queries, None: unknown
    evidence: str  # "attention_mask (1 = real token), padded on the left"
    batch_axis: int | None  # the reach's leading axis of the examples; None: alike


@dataclass(frozen=True, slots=True)
class SiteIntent:
    """What the model states about one site, each part with its evidence ("" unknown)."""

    own: tuple[int, ...] | None  # each query's own position along the keys (-1: none)
    padding: Padding | None
    causal: str  # evidence that the site is causal, "" where not established
    bidirectional: str  # evidence that some spans see later tokens on purpose
    window: int | None  # the keys a windowed layer sees, its own included
    window_evidence: str
    full: str  # evidence that the layer is a full-attention one ("" unknown)
    documents: tuple[tuple[int, ...], ...] | None  # per example, document of each key
    documents_evidence: str
    layer: int | None
    # The reach's leading axis of the examples, where padding or documents differ by
    # example (None: alike in every example).
    batch_axis: int | None = None
    # Evidence that the site is a cached step whose `own` keys come from how its keys
    # were assembled (`steps.own_at_step`), "" where it is not one.
    step: str = ""


def of_site(call, reach) -> SiteIntent | None:
    """The intent established for the site `call` is, whose reach is `reach`; None where
    nothing is (no root inputs, axes the trace cannot name)."""
    inputs = _root_inputs(call)
    axes = site_axes(call, reach)
    if axes is None:
        return None
    q_axis, k_axis, lead_dims = axes
    own = own_keys(q_axis, k_axis, reach.seq_q, reach.seq_k)
    step = ""
    if own is None:
        own, step = own_at_step(q_axis, k_axis, reach.seq_q, reach.seq_k) or (None, "")
    module = call.module
    padding = _padding(call, inputs, reach, q_axis, k_axis, lead_dims) if inputs else None
    if padding is None and inputs is not None and step and own is not None:
        padding = _step_padding(call, inputs, reach, lead_dims, own)
    if padding is None and inputs is not None and _untied_padding(inputs):
        return None  # which queries are padding is unknown: nothing can be claimed
    causal = ""
    if own is not None:  # the module's own word, else its config's or a sibling's
        found = model_causal.evidence(call, module, inputs, reach, own)
        causal = _causal(module) or found
    window, window_evidence, full, layer = _window(call, module)
    documents, documents_evidence, documents_axis = None, "", None
    if inputs is not None and own is not None:
        documents, documents_evidence, documents_axis = _documents(
            call, inputs, reach, k_axis, lead_dims
        )
    batch_axis = padding.batch_axis if padding is not None else None
    if documents_axis is not None:
        if batch_axis is not None and batch_axis != documents_axis:
            documents, documents_evidence = None, ""  # two readings of the examples: none
        else:
            batch_axis = documents_axis
    bidirectional = ""
    if inputs is not None:
        given = [n for n in _BIDIRECTIONAL if inputs.get(n) is not None]
        bidirectional = f"the model takes {given[0]}" if given else ""
    return SiteIntent(
        own=tuple(own) if own is not None else None,
        padding=padding,
        causal=causal,
        bidirectional=bidirectional,
        window=window,
        window_evidence=window_evidence,
        full=full,
        documents=documents,
        documents_evidence=documents_evidence,
        layer=layer,
        batch_axis=batch_axis,
        step=step,
    )


def _root_inputs(call) -> RootInputs | None:
    read = getattr(call, "root_inputs", None)
    found = read() if read is not None else None
    return found if isinstance(found, RootInputs) else None


# -- the site's axes -----------------------------------------------------------------------
def site_axes(call, reach) -> tuple[Any, Any, tuple] | None:
    """(the queries' axis, the keys' axis, the dims of the reach's leading axes) at the
    site, from the scores a softmax reads or the query and key an attention op takes."""
    bound = call.bound()
    spec = call.spec
    if spec in SOFTMAXES:
        scores = bound.get("input")
        dims = _dims(call, scores, 2)
        if dims is None:
            return None
        return dims[-2], dims[-1], _lead(dims[:-2], reach)
    dense_flash = spec.family == _ops.FLASH and spec.flash_form == "dense"
    if dense_flash:  # flash-attn's dense calls, by position
        query, key = (call.args[i] if len(call.args) > i else None for i in (0, 1))
    else:
        query, key = bound.get("query"), bound.get("key")
    q_dims, k_dims = _dims(call, query, 2), _dims(call, key, 2)
    if q_dims is None or k_dims is None:
        return None
    if spec is _ops.SDPA or spec is _ops.FLEX:
        return q_dims[-2], k_dims[-2], _lead(q_dims[:-2], reach)
    if spec is _ops.XFORMERS and len(q_dims) == len(k_dims) and len(q_dims) in (3, 4):
        # xformers' [batch, seq, heads, d_k] (or [batch, seq, d_k]): lead (batch, heads)
        heads = (q_dims[2],) if len(q_dims) == 4 else ()
        return q_dims[1], k_dims[1], _lead((q_dims[0], *heads), reach)
    if spec.family == _ops.FLASH and spec.flash_form == "varlen":
        # packed [tokens, heads, d_k]: the reach's lead is (heads,) over the packed tokens
        return q_dims[0], k_dims[0], _lead((q_dims[1],), reach)
    if dense_flash and len(q_dims) == 4 and len(k_dims) == 4:
        # flash-attn's [batch, seq, heads, d_k] (or "bhsd"): the reach's lead is (batch, heads)
        seq = 2 if call.kwargs.get("layout") == "bhsd" else 1
        return q_dims[seq], k_dims[seq], _lead((q_dims[0], q_dims[3 - seq]), reach)
    return None


def _dims(call, tensor, least: int):
    if not hasattr(tensor, "dim") or tensor.dim() < least:
        return None
    meta = call.meta(tensor)
    if meta is None or len(meta.dims) != tensor.dim():
        return None
    return meta.dims


def _lead(dims: tuple, reach) -> tuple:
    """The dims of the reach's leading axes, where the tensor's leading shape is it."""
    return tuple(dims) if len(dims) == len(reach.lead) else ()


# -- padding -------------------------------------------------------------------------------
def _padding(call, inputs, reach, q_axis, k_axis, lead_dims) -> Padding | None:
    for mask_name, mains, true_pads in _PADDING:
        mask = inputs.get(mask_name)
        if mask is None:
            continue
        found = _tied_rows(call, inputs, mask, mains, reach, k_axis, lead_dims, _padding_values)
        if found is None:
            continue
        keys, batch_axis, _ = found
        pad_rows = tuple(tuple(p if true_pads else not p for p in row) for row in keys)
        queries = None
        q_found = _tied_rows(
            call, inputs, mask, mains, reach, q_axis, lead_dims, _padding_values, seq=reach.seq_q
        )
        if q_found is not None:
            queries = tuple(tuple(p if true_pads else not p for p in r) for r in q_found[0])
        meaning = "True = padding" if true_pads else "1 = real token"
        return Padding(pad_rows, queries, f"{mask_name} ({meaning}){_side(pad_rows)}", batch_axis)
    return None


def _step_padding(call, inputs, reach, lead_dims, own) -> Padding | None:
    """The padding of a cached step's keys (`steps.padding_at_step`)."""
    found = padding_at_step(
        call, inputs, reach, lead_dims, own, _PADDING, lambda t: _values(inputs, t, _padding_values)
    )
    if found is None:
        return None
    pad_rows, mask_name, true_pads, batch_axis = found
    meaning = "True = padding" if true_pads else "1 = real token"
    return Padding(pad_rows, None, f"{mask_name} ({meaning}){_side(pad_rows)}", batch_axis)


def _untied_padding(inputs: RootInputs) -> bool:
    """Whether the root takes a padding mask with padding in it (or one it cannot read):
    then rows of padded queries may see anything, as transformers' SDPA path unmasks
    them, and a site whose axes that mask is not tied to is judged on nothing."""
    for mask_name, _, true_pads in _PADDING:
        mask = inputs.get(mask_name)
        if mask is None:
            continue
        values = _values(inputs, mask, _padding_values)
        if values is None or any(v == true_pads for row in values for v in row):
            return True
    return False


def _padding_values(values: list) -> list | None:
    """The mask's rows as bools (True where the value is 1 / True), or None where its
    values are not a padding mask's (an additive float mask, counts)."""
    flat = {v for row in values for v in row}
    if not flat <= {0, 1}:  # True, False, 0.0 and 1.0 are equal to these
        return None
    return [[bool(v) for v in row] for row in values]


def _side(pad_rows) -> str:
    sides = set()
    for row in pad_rows:
        if not any(row):
            continue
        first = row.index(False) if False in row else len(row)
        if all(row[:first]) and not any(row[first:]):
            sides.add("left")
        elif not row[0]:
            sides.add("right")
        else:
            sides.add("inside")
    return f", padded on the {' and '.join(sorted(sides))}" if sides else ", no padding"


def _tied_rows(call, inputs, tensor, mains, reach, site_axis, lead_dims, convert, seq=None):
    """The rows of a `[batch, seq]` input mapped onto the site's `site_axis` (of `seq`
    positions, the keys' unless given) by provenance: (rows per example, or one row where
    every example is alike; the reach's leading axis of the examples, None where alike;
    the converted values). None where the input is unread or nothing ties it."""
    seq = reach.seq_k if seq is None else seq
    values = _values(inputs, tensor, convert)
    if values is None:
        return None
    meta = call.meta(tensor)
    if meta is None or len(meta.dims) != 2:
        return None
    length = len(values[0])
    positions = own_keys(site_axis, meta.dims[1], seq, length)
    batch_dims = [meta.dims[0]]
    for name in mains:
        main = inputs.get(name)
        if main is None or main.dim() < 2 or tuple(main.shape[:2]) != tuple(tensor.shape):
            continue  # documented beside it: the same [batch, seq] by the model's API
        main_meta = call.meta(main)
        if main_meta is None or len(main_meta.dims) != main.dim():
            continue
        if positions is None:
            positions = own_keys(site_axis, main_meta.dims[1], seq, length)
        batch_dims.append(main_meta.dims[0])
    if positions is None or any(p < 0 for p in positions):
        return None
    rows = tuple(tuple(row[p] for p in positions) for row in values)
    if all(row == rows[0] for row in rows):
        return (rows[0],), None, values
    batch_axis = _batch_axis(lead_dims, batch_dims, reach, len(rows))
    if batch_axis is None:
        return None
    return rows, batch_axis, values


def _batch_axis(lead_dims, batch_dims, reach, batch: int) -> int | None:
    """The reach's leading axis that is the input's batch axis, by identity."""
    from .._names import dims as D

    wanted = [D.normalize(d) for d in batch_dims]
    for i, axis in enumerate(lead_dims):
        if reach.lead[i] == batch and D.normalize(axis) in wanted:
            return i
    return None


def _values(inputs, tensor, convert) -> list | None:
    """The input's values as nested lists, read once per forward; None where they cannot
    be read (meta, fake or an accelerator's tensor, too large, another dtype of meaning)."""
    key = (id(tensor), convert)
    if key in inputs.read:
        return inputs.read[key]
    found = None
    if _readable(tensor) and tensor.dim() in (1, 2):
        rows = tensor.tolist()
        found = convert([rows] if tensor.dim() == 1 else rows)
    inputs.read[key] = found
    return found


def _readable(tensor) -> bool:
    import torch

    return (
        type(tensor) is torch.Tensor
        and tensor.device.type == "cpu"
        and not tensor.is_meta
        and 0 < tensor.numel() <= _MAX_READ
    )


# -- causality, windows --------------------------------------------------------------------
def _causal(module) -> str:
    """The attention module's own declaration (`is_causal = True`), as transformers'
    attention modules and most hand-written decoders state it."""
    if module is not None and getattr(module, "is_causal", None) is True:
        return f"{type(module).__name__}.is_causal is True"
    return ""


def _window(call, module) -> tuple[int | None, str, str, int | None]:
    """(window, its evidence, evidence of a full-attention layer, the layer index) from
    the module's `sliding_window` and its config's `layer_types` at its `layer_idx`."""
    if module is None:
        return None, "", "", None
    layer = getattr(module, "layer_idx", None)
    if not isinstance(layer, int) or isinstance(layer, bool):
        match = _LAYER.search(call.module_path(module) or "")
        layer = int(match.group(1)) if match else None
    config = getattr(module, "config", None)
    types = getattr(config, "layer_types", None)
    kind = None
    if isinstance(types, list | tuple) and layer is not None and 0 <= layer < len(types):
        kind = types[layer]
    # The layer's own kind is more specific than a window size every layer carries
    # (Exaone 4 sets sliding_window on each layer and windows only where is_sliding).
    if kind == "full_attention":
        return None, "", f"config.layer_types[{layer}] is full_attention", layer
    if getattr(module, "is_sliding", None) is False:
        return None, "", "", layer  # not windowed; what else it is, it does not say
    own = getattr(module, "sliding_window", None)
    if isinstance(own, int) and not isinstance(own, bool) and own > 0:
        return own, f"{type(module).__name__}.sliding_window = {own}", "", layer
    if kind == "sliding_attention":
        size = getattr(config, "sliding_window", None)
        if isinstance(size, int) and size > 0:
            return (
                size,
                f"config.layer_types[{layer}] is sliding_attention, window {size}",
                "",
                layer,
            )
    # A config's sliding_window alone is no evidence: Mistral windows every layer with it,
    # Moshi declares one and masks causally (its mask is create_causal_mask's). No claim.
    return None, "", "", layer


# -- documents -----------------------------------------------------------------------------
def _documents(call, inputs, reach, k_axis, lead_dims):
    """(per example, the document of each key; its evidence), from position ids that
    restart within a row, document ids, or `cu_seqlens` over one packed row."""
    for name in _DOCUMENTS:
        ids = inputs.get(name)
        if ids is not None:
            found = _tied_rows(call, inputs, ids, ("input_ids",), reach, k_axis, lead_dims, _ints)
            if found is not None and any(len(set(r)) > 1 for r in found[0]):
                return _numbered(found[0]), f"{name} (a document per id)", found[1]
    positions = inputs.get(_POSITIONS[0])
    if positions is not None and positions.dim() == 2:
        found = _tied_rows(
            call, inputs, positions, ("input_ids", "inputs_embeds"), reach, k_axis, lead_dims, _ints
        )
        if found is not None:
            docs = tuple(_restarts(row) for row in found[0])
            if any(max(row) > 0 for row in docs):
                return docs, "position_ids that restart at 0 within a row", found[1]
    for name in _CU_SEQLENS:
        cu = inputs.get(name)
        if cu is None or cu.dim() != 1:
            continue
        bounds = _values(inputs, cu, _ints)
        if bounds is None or bounds[0][-1] != reach.seq_k or len(bounds[0]) < 3:
            continue
        row = []
        for doc, (a, b) in enumerate(zip(bounds[0], bounds[0][1:], strict=False)):
            row += [doc] * (b - a)
        return (tuple(row),), f"{name} {bounds[0]} (one packed row)", None
    return None, "", None


def _ints(values: list) -> list | None:
    if not all(isinstance(v, int) and not isinstance(v, bool) for row in values for v in row):
        return None
    return values


def _numbered(rows) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(row) for row in rows)


def _restarts(row) -> tuple[int, ...]:
    """A document number per position: a new one wherever the position ids restart at 0."""
    doc, out = 0, []
    for i, p in enumerate(row):
        if i and p == 0 and row[i - 1] != 0:
            doc += 1
        out.append(doc)
    return tuple(out)


def runs_of_keys(keys) -> Runs:
    """The runs of a sorted list of key indices."""
    runs: list[tuple[int, int]] = []
    for k in keys:
        if runs and runs[-1][1] == k:
            runs[-1] = (runs[-1][0], k + 1)
        else:
            runs.append((k, k + 1))
    return tuple(runs)
