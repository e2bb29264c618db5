"""torch's composite attention modules: checked at their boundary, run unobserved inside.

`nn.MultiheadAttention` and the `nn.Transformer*` modules take fused fast paths in
eval + no_grad (`torch._native_multi_head_attention`, `torch._transformer_encoder_layer_fwd`,
and `nn.TransformerEncoder`'s nested-tensor path, which leaves padded positions at 0)
only when `torch.overrides.has_torch_function(...)` is false, which any active
TorchFunctionMode makes true. So a session handles these modules (exact torch classes
whose whole tree is torch's own; a user subclass or a user module inside keeps its code
visible) at their boundary instead:

- on entry, the module call's arguments are bound and turned into the
  `F.multi_head_attention_forward` calls the module would make (in its `batch_first`
  layout, for each distinct attention of an encoder/decoder layer), and the checkers
  registered for that op run on them, with the attention module on the module stack,
  so messages read as they did when shapeguard saw torch's own call;
- then shapeguard's mode (the thread's interceptor) is popped off torch's function-mode
  stack (only when it is on top: another mode on top means the slow path anyway, and the
  ops inside stay visible as before);
- on exit (the session's `always_call` forward hook, which torch runs also when forward
  raises) the mode is pushed back and the call is recorded as one event.

A composite inside a composite (the encoder of `nn.Transformer`) is inside the
suspension already: it is neither checked nor recorded again.

`shapeguard.guard(nn.TransformerEncoderLayer(...))` puts no hook on the layer: a forward
hook on it or on any module inside it turns its fast path off. Guarded layers are watched
by one pair of global hooks instead, registered while any is guarded (`watch`).

Long because the boundary checks, the suspension of the modes and the watch of
guarded layers all work on torch's function-mode stack, which is kept in one module so
that its pops and pushes can be read (and kept balanced) in one place.
"""

import sys
import threading
import weakref
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING

import torch
from torch._C import (
    _get_function_stack_at,
    _len_torch_function_stack,
    _pop_torch_function_stack,
    _push_on_torch_function_stack,
)

from .. import _config, _ops, _source
from . import internal as _internal

if TYPE_CHECKING:
    import inspect

_MHA_OP = _ops.MHA.name  # the op nn.MultiheadAttention calls, as the checks know it
_MODULE_FILE = torch.nn.modules.module.__file__
_KINDS: dict[type, str] = {
    torch.nn.MultiheadAttention: "mha",
    torch.nn.TransformerEncoderLayer: "encoder_layer",
    torch.nn.TransformerDecoderLayer: "decoder_layer",
    torch.nn.TransformerEncoder: "encoder",
    torch.nn.TransformerDecoder: "decoder",
    torch.nn.Transformer: "transformer",
}
_local = threading.local()


def composite_kind(module) -> str | None:
    """ "mha", "encoder_layer", ... for an exact torch composite whose every submodule (and
    activation function) is torch's own; None for anything else."""
    kind = _KINDS.get(type(module))
    if kind is None:
        return None
    for sub in module.modules():
        if not type(sub).__module__.startswith("torch.nn."):
            return None  # user code inside: keep it visible
        activation = sub.__dict__.get("activation")  # a layer's activation function
        if callable(activation) and not getattr(activation, "__module__", "").startswith("torch"):
            return None
    return kind


# The kind of torch.compile's wrapper of a module: suspended, neither checked nor recorded.
COMPILED = "compiled"


def is_compiled_module(module) -> bool:
    """Whether `module` is torch.compile's wrapper of a module (`OptimizedModule`). Its
    forward runs compiled code, whose frames dynamo guards on the modes on the stack: under
    shapeguard's mode they are compiled once more and, past dynamo's recompile limit, run
    eagerly, with output that can differ in the last bits. So it is suspended as a
    composite is, unchecked: nothing of a compiled module is traced (design.md)."""
    frames = sys.modules.get("torch._dynamo.eval_frame")  # not loaded: nothing compiled
    wrapper = getattr(frames, "OptimizedModule", None)
    return wrapper is not None and isinstance(module, wrapper)


# -- torch's function-mode stack -----------------------------------------------------------
def top_mode():
    """The mode at the top of torch's function-mode stack, or None when it is empty."""
    n = _len_torch_function_stack()
    return _get_function_stack_at(n - 1) if n else None


def _pop_interceptors(session) -> list:
    """Pop the session's mode (its thread's one interceptor: `interceptor.acquire_interceptor`)
    when it is at the top of the stack; return what was popped (empty: another mode is on
    top, or the session holds none)."""
    mode = session._mode
    if mode is None or top_mode() is not mode:
        return []
    return [_pop_torch_function_stack()]


def _push_back(popped: list) -> None:
    for mode in reversed(popped):
        _push_on_torch_function_stack(mode)


# -- the module call -----------------------------------------------------------------------
def call_kwargs(module) -> dict:
    """The keyword arguments of the current call of `module`.

    A global forward pre-hook gets `(module, args)` only (torch has no `with_kwargs` for
    global pre-hooks), and masks usually come by keyword; `Module._call_impl` keeps them in
    its `inner` closure, which calls the hooks. Read only, never written."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(12):
        if frame is None:
            break
        code = frame.f_code
        if code.co_name == "inner" and code.co_filename == _MODULE_FILE:
            local = frame.f_locals
            if local.get("self") is module:
                found = local.get("kwargs")
                return found if isinstance(found, dict) else {}
        frame = frame.f_back
    return {}


_signatures: "weakref.WeakKeyDictionary[type, inspect.Signature]" = weakref.WeakKeyDictionary()


def _bind(module, args: tuple, kwargs: dict) -> dict | None:
    import inspect

    cls = type(module)
    signature = _signatures.get(cls)
    if signature is None:
        signature = _signatures[cls] = inspect.signature(cls.forward)
    try:
        bound = signature.bind(module, *args, **kwargs)
    except TypeError:
        return None  # a wrong call: torch says so itself
    bound.apply_defaults()
    return dict(bound.arguments)


@dataclass(slots=True)
class _Attention:
    """One call a composite makes to an nn.MultiheadAttention, as the module would make it."""

    path: str  # of the attention module, under the composite ("" for the composite itself)
    module: torch.nn.MultiheadAttention
    query: object
    key: object
    value: object
    key_padding_mask: object = None
    attn_mask: object = None
    need_weights: bool = False
    average_attn_weights: bool = True
    is_causal: bool = False


def _layer_calls(prefix: str, layer, kind: str, x, memory, masks: dict) -> list[_Attention]:
    calls = [
        _Attention(
            prefix + "self_attn",
            layer.self_attn,
            x,
            x,
            x,
            masks.get("self_kpm"),
            masks.get("self_mask"),
            is_causal=bool(masks.get("self_causal")),
        )
    ]
    if kind == "decoder_layer":
        calls.append(
            _Attention(
                prefix + "multihead_attn",
                layer.multihead_attn,
                x,
                memory,
                memory,
                masks.get("memory_kpm"),
                masks.get("memory_mask"),
                is_causal=bool(masks.get("memory_causal")),
            )
        )
    return calls


def _config_key(attention) -> tuple:
    return (
        attention.embed_dim,
        attention.kdim,
        attention.vdim,
        attention.num_heads,
        attention.batch_first,
        attention.bias_k is None,
        attention.add_zero_attn,
    )


def _stack_calls(prefix: str, stack, kind: str, x, memory, masks: dict) -> list[_Attention]:
    """The attention calls of an encoder's or decoder's layers: one per distinct layer
    configuration (torch builds the layers as copies of one), at the first such layer."""
    calls: list[_Attention] = []
    seen: set = set()
    for i, layer in enumerate(stack.layers):
        attentions = [layer.self_attn] + ([layer.multihead_attn] if kind == "decoder_layer" else [])
        key = tuple(_config_key(a) for a in attentions)
        if key in seen:
            continue
        seen.add(key)
        calls += _layer_calls(f"{prefix}layers.{i}.", layer, kind, x, memory, masks)
    return calls


def attention_calls(kind: str, module, p: dict) -> list[_Attention]:
    """The nn.MultiheadAttention calls the composite will make, from its bound arguments."""
    if kind == "mha":
        return [
            _Attention(
                "",
                module,
                p.get("query"),
                p.get("key"),
                p.get("value"),
                p.get("key_padding_mask"),
                p.get("attn_mask"),
                bool(p.get("need_weights")),
                bool(p.get("average_attn_weights")),
                bool(p.get("is_causal")),
            )
        ]
    encoder_masks = {
        "self_kpm": p.get("src_key_padding_mask"),
        "self_mask": p.get("src_mask", p.get("mask")),
        "self_causal": p.get("is_causal", p.get("src_is_causal")),
    }
    decoder_masks = {
        "self_kpm": p.get("tgt_key_padding_mask"),
        "self_mask": p.get("tgt_mask"),
        "self_causal": p.get("tgt_is_causal"),
        "memory_kpm": p.get("memory_key_padding_mask"),
        "memory_mask": p.get("memory_mask"),
        "memory_causal": p.get("memory_is_causal"),
    }
    if kind == "encoder_layer":
        return _layer_calls("", module, kind, p.get("src"), None, encoder_masks)
    if kind == "decoder_layer":
        return _layer_calls("", module, kind, p.get("tgt"), p.get("memory"), decoder_masks)
    if kind == "encoder":
        return _stack_calls("", module, "encoder_layer", p.get("src"), None, encoder_masks)
    if kind == "decoder":
        return _stack_calls(
            "", module, "decoder_layer", p.get("tgt"), p.get("memory"), decoder_masks
        )
    # nn.Transformer: the decoder attends to the encoder's output, which has src's shape.
    src = p.get("src")
    return _stack_calls(
        "encoder.", module.encoder, "encoder_layer", src, None, encoder_masks
    ) + _stack_calls("decoder.", module.decoder, "decoder_layer", p.get("tgt"), src, decoder_masks)


def functional_arguments(attention: _Attention) -> tuple[tuple, dict] | None:
    """The arguments nn.MultiheadAttention.forward passes to F.multi_head_attention_forward
    (masks as given: the checkers read bool and float masks alike)."""
    mha = attention.module
    q, k, v = attention.query, attention.key, attention.value
    if not (
        isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
    ):
        return None
    tensors = (q, k, v)
    if any(t.is_nested for t in tensors):
        return None
    if mha.batch_first and q.dim() == 3:
        # As MultiheadAttention.forward does: F.multi_head_attention_forward takes [seq, batch, E].
        q, k, v = (t.transpose(1, 0) if t.dim() >= 2 else t for t in tensors)
    args = (
        q,
        k,
        v,
        mha.embed_dim,
        mha.num_heads,
        mha.in_proj_weight,
        mha.in_proj_bias,
        mha.bias_k,
        mha.bias_v,
        mha.add_zero_attn,
        mha.dropout,
        mha.out_proj.weight,
        mha.out_proj.bias,
    )
    kwargs = {
        "training": mha.training,
        "key_padding_mask": attention.key_padding_mask,
        "need_weights": attention.need_weights,
        "attn_mask": attention.attn_mask,
    }
    if not mha._qkv_same_embed_dim:
        kwargs.update(
            use_separate_proj_weight=True,
            q_proj_weight=mha.q_proj_weight,
            k_proj_weight=mha.k_proj_weight,
            v_proj_weight=mha.v_proj_weight,
        )
    kwargs.update(
        average_attn_weights=attention.average_attn_weights, is_causal=attention.is_causal
    )
    return args, kwargs


def _modules_along(root, path: str) -> list:
    """The modules from `root` (excluded) down to `root.get_submodule(path)`."""
    if not path:
        return []
    found, module = [], root
    for part in path.split("."):
        module = getattr(module, part) if not part.isdigit() else module[int(part)]
        found.append(module)
    return found


def check(session, module, kind: str, args: tuple, kwargs: dict, site) -> None:
    """Run the checkers of F.multi_head_attention_forward on each attention call the
    composite will make; the session raises or warns as for torch's own call."""
    __tracebackhide__ = True
    from .. import checks
    from .call import OpCall

    bound = _bind(module, args, kwargs)
    if bound is None:
        return
    rules = checks.rules_for(_MHA_OP)
    stack = session.module_stack
    func = torch.nn.functional.multi_head_attention_forward
    with torch.no_grad():
        for attention in attention_calls(kind, module, bound):
            arguments = functional_arguments(attention)
            if arguments is None:
                continue
            depth = len(stack)
            # The attention module innermost, as when torch's own call was intercepted.
            stack.extend(_modules_along(module, attention.path))
            try:
                call = OpCall(session, func, _MHA_OP, arguments[0], arguments[1], site)
                for rule in rules:
                    try:
                        for violation in rule.check(call):
                            violation.severity = checks.severity(rule, violation)
                            session.report(violation, call)
                    except Exception as error:
                        # The rule's own failure: skipped, the module runs (`_internal`).
                        where = f"rule {rule.family}.{rule.check.__qualname__}"
                        if not _internal.contained(session.trace, error, where, _MHA_OP, site):
                            raise
                if call.reach:
                    session.keep_reach(call.reach)
            finally:
                del stack[depth:]


# -- suspension ----------------------------------------------------------------------------
@dataclass(slots=True)
class _Suspension:
    module: torch.nn.Module
    popped: list  # shapeguard modes taken off the stack, top first
    op: str
    args: tuple
    kwargs: dict
    site: object
    record: bool = True


@dataclass(slots=True)
class _State:
    """A session's composite bookkeeping."""

    suspension: _Suspension | None = None
    kinds: "weakref.WeakKeyDictionary" = field(default_factory=weakref.WeakKeyDictionary)

    def kind(self, module) -> str | None:
        if type(module) not in _KINDS:
            return COMPILED if is_compiled_module(module) else None
        try:
            return self.kinds[module]
        except KeyError:
            found = self.kinds[module] = composite_kind(module)
            return found


def _state(session) -> _State:
    state = session.__dict__.get("_composites")
    if state is None:
        state = session.__dict__["_composites"] = _State()
    return state


def suspended(session) -> bool:
    """Whether the session is inside a composite it suspended (whose modules it sees enter)."""
    state = session.__dict__.get("_composites")
    return state is not None and state.suspension is not None


def suspending() -> bool:
    """Whether a composite of this thread holds shapeguard's mode off the stack."""
    return any(s.popped for s in _active())


def _active() -> list:
    found = getattr(_local, "active", None)
    if found is None:
        found = _local.active = []
    return found


def enter(session, module, args: tuple, kwargs: dict) -> None:
    """On entering `module` in the session's module stack: check a composite at its
    boundary, then suspend the thread's interceptor for its forward."""
    __tracebackhide__ = True
    state = _state(session)
    if state.suspension is not None:
        return  # inside a composite: its ops, nested composites included, are unseen
    if session.observers:
        # An observer sees every op (`Session.observe`): the slow path, whose ops the
        # session sees one by one, as it did when the observers were modes on top of ours.
        return
    kind = state.kind(module)
    if kind is None:
        return
    kwargs = kwargs or call_kwargs(module)
    # A guard's own session opened inside a composite another session suspended (the
    # pytest plugin's, which checked it already): take this session's mode off too.
    outer = any(s.module is module for s in _active())
    popped = _pop_interceptors(session)
    if not popped and not outer:
        return  # another mode on top: the slow path, whose ops the session sees as before
    enabled = _config.is_enabled() and kind != COMPILED
    site = _source.user_site() if enabled else None
    if enabled and not outer:
        try:
            check(session, module, kind, args, kwargs, site)
        except BaseException:
            _push_back(popped)
            raise
    op = _MHA_OP if kind == "mha" else type(module).__name__
    suspension = _Suspension(module, popped, op, args, kwargs, site, record=enabled)
    state.suspension = suspension
    _active().append(suspension)


def observed(session) -> bool:
    """On `Session.observe`, and when an observation ends: while a composite is suspended,
    an observed session's mode is back on the stack, so its observers see the composite's
    ops (which the session lets through unchecked: `Session._observed`), as a mode pushed
    on top of a suspension saw them. Returns whether a composite is suspended."""
    state = session.__dict__.get("_composites")
    suspension = state.suspension if state is not None else None
    if suspension is None:
        return False
    if session.observers and suspension.popped:
        _push_back(suspension.popped)
        suspension.popped = []
    elif not session.observers and not suspension.popped:
        suspension.popped = _pop_interceptors(session)
    return True


def leave(session, module, output) -> None:
    """On leaving `module`: push the suspended modes back and record the call (only for
    the session that is current, and only when forward returned)."""
    __tracebackhide__ = True
    state = session.__dict__.get("_composites")
    if state is None or state.suspension is None or state.suspension.module is not module:
        return
    suspension, state.suspension = state.suspension, None
    try:
        _discard(suspension)
        from .current import current_session

        if output is not None and suspension.record and current_session() is session:
            _record(session, suspension, output)
    finally:
        _push_back(suspension.popped)


def release(session) -> None:
    """Push back what a session suspended and never restored (forward interrupted by a
    BaseException, for which torch runs no always_call hook): before its mode is popped."""
    state = session.__dict__.get("_composites")
    if state is not None and state.suspension is not None:
        suspension, state.suspension = state.suspension, None
        _discard(suspension)
        _push_back(suspension.popped)


def _discard(suspension: _Suspension) -> None:
    active = _active()
    for i in range(len(active) - 1, -1, -1):
        if active[i] is suspension:
            del active[i]
            return


def _plain(value) -> bool:
    return isinstance(value, torch.Tensor) and not value.is_nested


def _record(session, suspension: _Suspension, output) -> None:
    """The composite's call as one event: its tensor arguments in, its tensors out."""
    from .call import OpCall

    outputs = output if isinstance(output, tuple | list) else (output,)
    outputs = tuple(t for t in outputs if _plain(t))
    if not outputs:
        return
    args = tuple(a for a in suspension.args if _plain(a))
    kwargs = {k: v for k, v in (suspension.kwargs or {}).items() if _plain(v)}
    spec = _ops.by_name(type(suspension.module).__name__)  # the composite's axis rule
    call = OpCall(
        session, type(suspension.module).forward, suspension.op, args, kwargs, suspension.site, spec
    )
    session._record(call, outputs)


# -- guarded composites --------------------------------------------------------------------
def hooks_turn_off_fast_path(module) -> bool:
    """Whether a hook on `module` itself would turn its fast path off:
    nn.TransformerEncoderLayer takes it only when no module of its tree has a forward
    hook or pre-hook (nn.MultiheadAttention and the others do not look)."""
    return composite_kind(module) == "encoder_layer"


# id(module) -> (weakref to it, pre, post); ids, not weak keys, so that the finalizer
# that forgets a collected module sees the table without it.
_watched: dict[int, tuple] = {}
_watch_handles: list = []


def _forget(key: int) -> None:
    _watched.pop(key, None)
    if not _watched:
        for handle in _watch_handles:
            handle.remove()
        _watch_handles.clear()


class _Watch:
    """What `guard` keeps as the handle of a watched module: `remove()` unwatches it (and
    the global hooks go with the last one, or when the last one is collected)."""

    __slots__ = ("_finalizer",)

    def __init__(self, module) -> None:
        self._finalizer = weakref.finalize(module, _forget, id(module))

    def remove(self) -> None:
        self._finalizer()  # runs _forget once, now


def watch(module, pre, post) -> _Watch:
    """Call `pre(module, args, kwargs)` and `post(module, args, kwargs, output)` around each
    forward of `module` from global hooks, leaving the module's own hook dicts empty."""
    _watched[id(module)] = (weakref.ref(module), pre, post)
    if not _watch_handles:
        hooks = torch.nn.modules.module
        _watch_handles.extend(
            [
                hooks.register_module_forward_pre_hook(_watch_pre),
                # Not with_kwargs: torch leaves that flag behind when the hook is removed.
                hooks.register_module_forward_hook(_watch_post, always_call=True),
            ]
        )
    return _Watch(module)


def _hooks_of(module):
    entry = _watched.get(id(module))
    return entry if entry is not None and entry[0]() is module else None


def _watch_pre(module, args):
    __tracebackhide__ = True
    hooks = _hooks_of(module)
    if hooks is None:
        return
    from .current import current_session

    before = current_session()
    try:
        hooks[1](module, args, call_kwargs(module))
    finally:
        session = current_session()
        if session is not None and session is not before and session.owner is module:
            # The session the guard opened for this call sees nothing inside the
            # suspended composite, so its module hooks go now: closing it from
            # `_watch_post` in torch's exception path, which iterates the global forward
            # hooks themselves, must not remove one.
            session._remove_hooks()


def _watch_post(module, args, output):
    __tracebackhide__ = True
    hooks = _hooks_of(module)
    if hooks is None:
        return
    from .current import current_session

    try:
        session = current_session()
        if session is not None:
            # Before the guard closes a session it opened for this call.
            leave(session, module, output)
    finally:
        hooks[2](module, args, call_kwargs(module), output)
