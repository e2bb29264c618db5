"""Recording an op on the reference path: its outputs named (labels, roles, axes by
the op's axis rule) and its event kept on the trace, shapes only.
"""

import dataclasses

import torch

from .. import _ops, _source, _tp
from .._memo import Memo
from .._names import flow as _flow
from . import grouping as _grouping
from . import replay as _replay
from . import tp_session as _tp_session
from .call import OpCall, dtype_name
from .current import current_session
from .meta import Facts, TensorMeta, buffer_origin, role_for
from .session_state import SessionState


def static(tensor, meta: TensorMeta | None = None) -> tuple:
    """What an event keeps of a tensor besides its meta: torch.Size holds ints, never the
    tensor; of a DTensor also its placements and local shape (`_tp_session.record_sharding`,
    which gives its local shard the DTensor's axes when the meta is known). One tuple
    shared by the events of tensors alike (`shared`)."""
    dtype = tensor.dtype
    device = "cpu" if tensor.is_cpu else "meta" if tensor.is_meta else tensor.device.type
    facts = _DTYPE_FACTS.get(dtype)
    if facts is None:
        facts = _DTYPE_FACTS.put(dtype, (dtype_name(dtype), dtype.itemsize))
    if type(tensor) is not torch.Tensor and _tp.is_dtensor(tensor):
        sharded = _tp_session.record_sharding(tensor, meta, current_session())
        return tensor.shape, facts[0], device, facts[1], sharded
    return shared((tensor.shape, facts[0], device, facts[1]))


# (name, item size) by dtype: two reads of every tensor an event keeps, made once per dtype.
_DTYPE_FACTS = Memo("dtype facts", 256)  # torch has a few dozen dtypes
# Tuples events keep, one of each value (`shared`): the collector tracks every tuple and
# torch.Size an event keeps, and a run makes a full collection per some 70,000 of them
# kept (the 3.11 collector counts objects made and not yet freed), so a traced test or
# training loop that kept four per tensor of each op paid for several more. Ops repeat
# their shapes and signatures: one tuple each, bounded (a model has a few hundred).
_SHARED = Memo("shared tuples", 8192)


def shared(value: tuple) -> tuple:
    """`value`, or the equal tuple an event already keeps: a tensor's static part
    (`static`), or the tuple of an op's inputs' or outputs' ones. An unhashable one (a
    symbolic size, a DTensor's sharding) is its own."""
    try:
        found = _SHARED.get(value)
    except TypeError:
        return value
    if found is None:
        found = _SHARED.put(value, value)
    return found


def symbolic(out) -> bool:
    """Whether an output has symbolic sizes (a fake tensor: make_fx, export)."""
    return any(t._has_symbolic_sizes_strides for t in tensors_of(out))


def tensors_of(out) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, tuple | list):
        return [t for t in out if isinstance(t, torch.Tensor)]
    return []


class Recording(SessionState):
    """A session's naming and recording of an op's outputs (`Session` is one)."""

    def keep_reach(self, reach: tuple, step=None) -> None:
        """Keep the attention reach the rules read at a call (`OpCall.reach`) on the trace,
        at the event the op is about to be, and on its step, so that a replay of the step
        keeps it again (`ReplayLayer._replay_op`)."""
        trace = self.trace
        event = trace.event_count
        for found in reach:
            # Layers alike see alike: one tuple of rows for all of them (`shared`), so what a
            # trace keeps per site is a few objects, not one tuple per row.
            patterns = shared(found.patterns)
            trace.add_reach(dataclasses.replace(found, event=event, patterns=patterns))
        if step is not None:
            step.reach = reach

    def _record(self, call: OpCall, out) -> list:
        """Name the op's outputs and record its event; returns the outputs' metas."""
        outputs = tensors_of(out)
        if not outputs:
            return []
        spec = call.spec
        in_tensors = call.tensors()
        meta_of = call.meta_of
        in_metas = [meta_of(t) for t in in_tensors]
        made = _flow.propagate(call, outputs)
        self.tp.carry(call, in_tensors, outputs)
        labels = self._output_labels(call, len(outputs))
        first_label = in_metas[0].label if in_metas else None
        if spec.keeps_value and len(in_tensors) == 1:
            buffer, sliced = buffer_origin(
                True, spec.slices, in_tensors, in_metas, self.module_stack
            )
        else:  # what buffer_origin answers for these, without the call
            buffer, sliced = "", False
        out_metas = []
        slot = self.step * _replay.MAX_OUTPUTS
        flagged = call.flagged
        op = call.op
        table = self.metas
        groups = _grouping.carried(call, in_metas, len(outputs))
        for k, (tensor, m) in enumerate(zip(outputs, made, strict=True)):
            label = labels[k] if k < len(labels) else None
            if label is None and k == 0 and first_label:
                label = self._kept_label(call, spec, in_metas, first_label)
            meta = TensorMeta.made(
                m.dims,
                Facts(
                    tags=m.tags,
                    label=label,
                    role=role_for(label, m.role),
                    op=op,
                    buffer=buffer,
                    sliced=sliced,
                    rotary=m.rotary,
                    param=m.param,
                    flagged=flagged,
                    laid_out=m.laid_out,
                    normed=m.normed,
                    addresses=m.addresses,
                    normed_over=m.normed_over,
                    weighted=m.weighted,
                    grouped=groups[k] if k < len(groups) else (),
                ),
                slot + k + 1,
            )
            table[tensor] = meta
            out_metas.append(meta)
        trace = self.trace
        if len(trace._events) + len(trace._pending) >= trace.max_events:
            trace.dropped_events += 1
            return out_metas
        stack = self.module_stack
        if stack:  # module_description's path and class, without its "path (Class)"
            module = self.described_module()
            path, cls = self.module_path(module), type(module).__name__
        else:
            path = cls = ""
        trace.record(
            op,
            path,
            cls,
            call.site,
            shared(tuple([static(t, m) for t, m in zip(in_tensors, in_metas, strict=True)])),
            shared(tuple([static(t, m) for t, m in zip(outputs, out_metas, strict=True)])),
            (*in_metas, *out_metas),
        )
        return out_metas

    def _kept_label(self, call: OpCall, spec, in_metas: list, first_label: str) -> str | None:
        """The label an output keeps from its input when the source line gives none."""
        if spec.family == _ops.LAYOUT and call.args and hasattr(call.args[0], "dim"):
            ndim = call.args[0].dim()
            order = _flow.layout_order(call, ndim)
            moved = [i for i, j in enumerate(order or ()) if i != j]
            if len(moved) == 2 and moved == [ndim - 2, ndim - 1]:
                return first_label + "^T"  # the last two axes swapped: K^T
        if spec.keeps_label:
            return first_label
        if spec.makes_mask and in_metas[0].role == "mask":
            return first_label  # `mask == 0` is still the mask
        if call.op == "__getitem__":
            # A slice of a tensor is that tensor: `self.bias[:, :, :T, :T]` is `bias`.
            text = call.source_text(0)
            return _source.short_label(text) if text else first_label
        return None

    def _output_labels(self, call: OpCall, count: int) -> tuple[str | None, ...]:
        site = call.site
        if site is None or not site.targets:
            return ()
        if site.in_module:
            # Inside a module called from this line: only a leaf module (Linear,
            # Dropout, LayerNorm) is one op, so only its output takes the target name.
            module = call.module
            if module is None or next(module.children(), None) is not None:
                return ()
        elif not call.site_matches():
            return ()
        if len(site.targets) == count:
            return site.targets
        return (site.targets[0],) if len(site.targets) == 1 else ()
