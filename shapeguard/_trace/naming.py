"""Naming a session's tensors first seen: the root's inputs (parameter names as labels,
axes by the usual layouts) and tensors made outside the trace (fresh axes, state names).
"""

import inspect
import weakref

import torch

from .._names import dims as _dims
from .._names import roots as _roots
from . import replay as _replay
from . import replay_effects as _replay_effects
from .meta import FRESH, FRESH_PARAM, TensorMeta, role_for
from .session_state import SessionState


class InputNaming(SessionState):
    """A session's metas of tensors first seen (`Session` is one)."""

    def _input_tensors(self, module, args: tuple, kwargs: dict) -> list:
        names = _parameter_names(type(module))
        tensors = [(names[i] if i < len(names) else f"arg{i}", a) for i, a in enumerate(args)]
        tensors += list(kwargs.items())
        return [leaf for name, value in tensors for leaf in _nested_tensors(name, value)]

    def _name_inputs(self, module, args: tuple, kwargs: dict, step=None) -> None:
        """The root's inputs: parameter names as labels, axes by the usual layouts."""
        tensors = self._input_tensors(module, args, kwargs)
        capture = None
        if step is not None:
            # What a replay compares: the inputs' names, and what each one is.
            plain = [t for _, t in tensors]
            self._describe_inputs(step, plain)
            step.args = tuple(name for name, _ in tensors)
            capture = _replay_effects.Capture([self.meta_of(t) for t in plain])
        declared = self.declared_sizes(module)
        mains, masks = [], []
        try:
            for name, tensor in tensors:
                meta = self.meta_of(tensor)
                if meta.label is None:
                    meta.label, meta.role = name, role_for(name, None)
                if tensor.dtype == torch.bool or meta.role == "mask":
                    masks.append(meta)
                else:
                    _roots.claim_input(meta.dims, tensor, name, declared)
                    mains.append((tensor, meta))
            _roots.pair_sequences(mains)
            for meta in masks:
                main = mains[0][1].dims if mains else ()
                _roots.guess_mask(meta.dims, main)
                _roots.mask_batch(meta.dims, main)
        except BaseException:
            if capture is not None:
                capture.abandon()
            raise
        if capture is not None:
            try:
                step.effects = capture.end([])
            except _replay_effects.Outside:
                step.kind = _replay.BARRIER
                step.why = _replay.Why.OUTSIDE

    def meta_of(self, tensor) -> TensorMeta:
        """The meta of `tensor`; one first seen here (a tensor made outside the trace, a
        parameter) gets new axes of its own."""
        meta = self.metas.get(tensor)
        if meta is None and type(tensor) is not torch.Tensor:
            meta = self.tp.dtensor_meta(tensor)  # a DTensor from_local made: its shard's axes
            if meta is not None:
                self.metas[tensor] = meta
        if meta is None:
            meta = self._fresh_meta(tensor, self._state_name(tensor))
        return meta

    def _fresh_meta(self, tensor, name: str) -> TensorMeta:
        """New axes for a tensor first seen here, `name` its state name (or "")."""
        if not isinstance(tensor, torch.Tensor):
            # A caller (a rule) took a non-tensor for a tensor: its bug, contained where
            # it runs (`_internal`) and loud in shapeguard's own suite.
            raise TypeError(f"shapeguard asked for the axes of a {type(tensor).__name__}")
        param = isinstance(tensor, torch.nn.Parameter)
        origin = "a parameter" if param else "a tensor made outside the trace"
        axes = _dims.fresh_axes(tuple(tensor.shape))
        for i, axis in enumerate(axes):
            for dim, _, _ in axis:
                dim.origin = f"axis {i} of {name}" if name else origin
                dim.param = dim.origin if param else ""
        meta = TensorMeta.made(axes, FRESH_PARAM if param else FRESH, 0)
        self._fresh -= 1
        meta.slot = self._fresh
        self.metas[tensor] = meta
        return meta

    def _state_name(self, tensor) -> str:
        """The qualified name of a parameter or buffer of the root module (for messages)."""
        if self._state_names is None:
            root = self.root
            self._state_names = {}
            if root is not None and hasattr(root, "named_parameters"):
                for name, value in (*root.named_parameters(), *root.named_buffers()):
                    self._state_names[id(value)] = name
        return self._state_names.get(id(tensor), "")


def _nested_tensors(name: str, value, depth: int = 0) -> list:
    """(label, tensor) for a root input and the tensors nested in it: a dict or dataclass
    batch (`batch.input_ids`), a few levels deep. Tuples are not looked into (a legacy
    cache is a tuple of tuples of past keys and values, not a batch)."""
    if isinstance(value, torch.Tensor):
        return [(name, value)]
    if depth >= 3:
        return []
    if isinstance(value, dict):
        items = list(value.items())
    elif hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        items = [(f, getattr(value, f, None)) for f in value.__dataclass_fields__]
    else:
        return []
    found = []
    for key, item in items:
        found += _nested_tensors(f"{name}.{key}", item, depth + 1)
    return found


# Not a memo: weak keys, so bounded by the module classes alive.
_param_cache: "weakref.WeakKeyDictionary[type, tuple[str, ...]]" = weakref.WeakKeyDictionary()


def _parameter_names(cls: "type[torch.nn.Module]") -> tuple[str, ...]:
    names = _param_cache.get(cls)
    if names is None:
        try:
            params = list(inspect.signature(cls.forward).parameters)
        except (TypeError, ValueError):
            params = []
        names = tuple(p for p in params if p != "self")
        _param_cache[cls] = names
    return names
