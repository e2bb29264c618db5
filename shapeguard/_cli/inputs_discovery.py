"""One provisional forward, observed through a session with checks off and module
pre-hooks of its own, that watches what consumes each input first, until nothing
changes (`inputs_structure`)."""

import inspect

from .. import _ops
from .inputs_guess import any_embedding
from .inputs_making import Maker
from .inputs_structure import FLOAT, IDS, MASK, Leaf
from .inputs_uses import (
    InputUse,
    flat_args,
    is_bool,
    mask_use,
    module_path,
    module_use,
    op_use,
    out_tensors,
    refine,
    shape_of,
)

_SUBTRACTS = frozenset({_ops.by_name("sub"), _ops.by_name("neg")})
# Ops that hand on an input unchanged in meaning: a mask through them is still the raw mask.
_PASS_FAMILIES = frozenset({_ops.VIEW, _ops.LAYOUT, _ops.INDEX, _ops.GROW, _ops.PART})
_DROPOUT = _ops.by_name("dropout")
_COMPARES = frozenset({_ops.by_name("eq"), _ops.by_name("ne")})
_MAX_ROUNDS = 4
# Buffers up to this many elements are saved before a provisional forward and put back.
_BUFFER_LIMIT = 1 << 24


class _Done(BaseException):
    """Every input has been read: the provisional forward stops here (a BaseException, so
    the model's own `except Exception` does not catch it)."""


def discover(model, nodes: dict, assemble, maker: Maker, sizes) -> None:
    """Refine `nodes` ({parameter: Leaf | Batch}) from what consumes each leaf in a
    provisional forward of `model(*assemble(values))`, until nothing changes.

    Best effort: a forward that fails is a forward that taught less; nothing here raises
    but the LoadError of an input too large to make.
    """
    leaves = [leaf for node in nodes.values() for leaf in leaves_of(node)]
    if not leaves:
        return
    flipped: set[int] = set()
    for _ in range(_MAX_ROUNDS):
        values = {name: maker.value(node) for name, node in nodes.items()}
        args, kwargs = assemble(values)
        tensors = {}
        for name, node in nodes.items():
            for leaf, tensor in zip(leaves_of(node), _tensors(node, values[name]), strict=True):
                tensors[id(tensor)] = (leaf, tensor)
        for leaf in leaves:
            leaf.use = None
        failed = _watch(model, args, kwargs, tensors, leaves)
        changed = False
        for leaf in leaves:
            if leaf.use is not None:
                changed |= refine(leaf, leaf.use, model, sizes)
        if changed:
            continue
        # The forward failed before reading a leaf: maybe the first guess was the wrong
        # kind (`B, T = x.shape` on activations made for token ids, or the reverse).
        unread = [
            leaf
            for leaf in leaves
            if failed and leaf.use is None and not leaf.fixed and id(leaf) not in flipped
        ]
        if not unread or not _flip(unread[0], model, sizes):
            break
        flipped.add(id(unread[0]))
    for leaf in leaves:
        leaf.settled = _settled(leaf)
        leaf.use = None


def _settled(leaf: Leaf) -> bool:
    """Whether what first consumed the leaf took it as made: an embedding its ids, a layer
    its width, the scores its mask (`inputs_blame`)."""
    from .._names.axes import broadcast_shapes

    use = leaf.use
    if use is None:
        return False
    if use.vocab is not None or use.width is not None:
        return True
    if use.what == "mha":
        return True
    if leaf.kind == MASK and use.target and use.shape:
        return broadcast_shapes(tuple(use.shape), tuple(use.target)) == tuple(use.target)
    return False


def tensors_of(node, value) -> list:
    """The tensors of a node's value, in the order of `leaves_of(node)`."""
    return _tensors(node, value)


def leaves_of(node) -> list[Leaf]:
    return [node] if isinstance(node, Leaf) else list(node.fields.values())


def _tensors(node, value) -> list:
    if isinstance(node, Leaf):
        return [value]
    if node.kind == "dict":
        return [value[key] for key in node.fields]
    return [getattr(value, key) for key in node.fields]


def _flip(leaf: Leaf, model, sizes) -> bool:
    embedding = any_embedding(model)
    if leaf.kind == FLOAT and embedding is not None:
        leaf.kind, leaf.shape, leaf.vocab = IDS, leaf.shape[:2], embedding.num_embeddings
        leaf.why = (
            f"{module_path(model, embedding)} = nn.Embedding({embedding.num_embeddings}, ...)"
        )
        return True
    if leaf.kind == IDS:
        width = sizes.width()
        if width is None:
            return False
        leaf.kind, leaf.shape, leaf.vocab = FLOAT, (*leaf.shape[:2], width), 0
        return True
    return False


def _watch(model, args, kwargs, tensors: dict, leaves: list[Leaf]) -> bool:
    """One provisional forward; each leaf's `use` is set to what read it. True when the
    forward raised (other than stopping because every leaf was read)."""
    watcher = _Watcher(tensors, leaves, model)
    observing = _Observing(watcher)
    error = provisional_forward(
        model, args, kwargs, lambda session: observing, pre_hook=watcher.module_call
    )
    return error is not None


def provisional_forward(model, args, kwargs, observer_for, pre_hook=None) -> Exception | None:
    """`model(*args, **kwargs)` observed with checks off (`run_observed`), leaving the
    user's state as it was: no grad, train/eval modes and small buffers put back, the RNG
    untouched. `pre_hook` is a forward pre-hook on torch's own modules. Returns what the
    forward raised (None when it returned, or stopped because every input was read)."""
    import torch

    from .._trace.opening import run_observed

    training = {m: m.training for m in model.modules()}
    # A forward may write into its buffers (a cache, a step count): put back what it wrote.
    buffers = [b for b in model.buffers() if b.device.type == "cpu" and b.numel() <= _BUFFER_LIMIT]
    saved = [(b, b._version, b.detach().clone()) for b in buffers]
    # Local hooks on torch's own modules: a global pre-hook gets no keyword arguments.
    handles = [
        m.register_forward_pre_hook(pre_hook, with_kwargs=True)
        for m in (model.modules() if pre_hook is not None else ())
        if type(m).__module__.startswith("torch.nn.")
    ]
    error = None
    try:
        model.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            run_observed(model, args, kwargs, observer_for)
    except _Done:
        pass
    except Exception as raised:
        error = raised
    finally:
        for handle in handles:
            handle.remove()
        for module, flag in training.items():
            module.training = flag
        with torch.no_grad():
            for buffer, version, value in saved:
                if buffer._version != version and buffer.shape == value.shape:
                    buffer.copy_(value)
    return error


class _Observing:
    """The session's observer (`_trace.opening.run_observed`) for a `_Watcher`: what an
    op reads, before it runs; what its output carries on, after."""

    __slots__ = ("follow", "watcher")

    def __init__(self, watcher: "_Watcher") -> None:
        self.watcher = watcher
        self.follow: list = []

    def before(self, func, op: str, args: tuple, kwargs: dict) -> None:
        self.follow = self.watcher.before(_ops.lookup(op), op, args, kwargs)

    def after(self, func, op: str, args: tuple, kwargs: dict, out, count: int) -> None:
        follow, self.follow = self.follow, []
        self.watcher.after(follow, out)


class _Watcher:
    """Follows the leaves and what is made of them through one forward."""

    def __init__(self, tensors: dict, leaves: list[Leaf], model) -> None:
        # id(tensor) -> (leaf, via, tensor): the tensor is kept, so its id is not reused.
        self.tracked = {key: (leaf, "direct", tensor) for key, (leaf, tensor) in tensors.items()}
        self.leaves = leaves
        self.model = model
        self.open = {id(leaf) for leaf in leaves}  # not resolved yet

    def _done(self) -> None:
        if not self.open:
            raise _Done

    def _resolve(self, leaf: Leaf, use: InputUse) -> None:
        if id(leaf) in self.open:
            if leaf.use is not None and leaf.use.subtracted:
                use.subtracted = True
            leaf.use = use
            self.open.discard(id(leaf))

    # -- torch's own modules -------------------------------------------------------------
    def module_call(self, module, args, kwargs):
        if not type(module).__module__.startswith("torch.nn."):
            return None
        try:
            bound = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
        except (TypeError, ValueError):
            return None
        hit = False
        for param, value in bound.items():
            entry = self.tracked.get(id(value))
            if entry is None or id(entry[0]) not in self.open:
                continue
            use = module_use(module, param, entry[1], value, bound)
            if use is not None:
                self._resolve(entry[0], use)
                hit = True
        if hit:
            self._done()
        return None

    # -- ops ---------------------------------------------------------------------------
    def before(self, op, spelling: str, args: tuple, kwargs: dict) -> list:
        """Resolve the leaves this op reads; return those its output still carries
        (through views and casts, and for a mask through elementwise ops), for `after`."""
        found = []
        for value in flat_args(args, kwargs):
            entry = self.tracked.get(id(value))
            if entry is not None and id(entry[0]) in self.open:
                found.append((entry, value))
        if not found:
            return []
        bound = _ops.bind(op, args, kwargs)
        # Views, casts and copies (the table's value-keeping ops) and dropout pass an input on.
        keeps = (
            op.family in _PASS_FAMILIES
            or (op.family == _ops.SAME and op.keeps_value and op.keeps_label)
            or op is _DROPOUT
        )
        follow = []
        for (leaf, via, _), value in found:
            if leaf.kind == MASK:
                use = mask_use(op, bound, via, value, args, self.tracked)
                if use is not None:
                    self._resolve(leaf, use)
                elif keeps:
                    follow.append((leaf, "view" if via == "direct" else via))
                elif op.family in (_ops.SAME, _ops.BINARY):
                    if leaf.use is None:  # the first thing the code does with the mask
                        leaf.use = InputUse(op.name, via, shape=shape_of(value))
                        leaf.use.subtracted = op in _SUBTRACTS and via != "arith" and is_bool(value)
                    follow.append((leaf, "arith"))
                else:
                    self._resolve(leaf, InputUse(op.name, via, shape=shape_of(value)))
            elif keeps:
                follow.append((leaf, "view" if via == "direct" else via))
            elif op in _COMPARES and _to_a_number(args, value):
                # `trg != pad_idx`: read as ids or a mask are read, which says nothing of
                # its kind or size; what reads it next does (its embedding), or, when the
                # forward fails first, `_flip` tries ids.
                continue
            else:
                self._resolve(leaf, op_use(op, bound, via, value))
        self._done()
        return follow

    def after(self, follow: list, out) -> None:
        for tensor in out_tensors(out) if follow else ():
            for leaf, via in follow:
                self.tracked.setdefault(id(tensor), (leaf, via, tensor))


def _to_a_number(args: tuple, value) -> bool:
    """Whether an op's operands are `value` and a Python int (`ids != 0`)."""
    return any(a is value for a in args) and any(
        isinstance(a, int) and not isinstance(a, bool) for a in args
    )
