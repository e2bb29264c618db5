"""Head counts inside a trace: torch's constructors, and modules as they are first entered.

- `nn.MultiheadAttention(1024, 12)` (directly, or inside `nn.TransformerEncoderLayer`,
  `nn.Transformer`, a user's `__init__`) raises torch's bare
  `AssertionError: embed_dim must be divisible by num_heads`. When that error leaves a
  `with shapeguard.trace():` block, `report_construction_error` turns it into the
  `head_divisibility` ShapeError, in the names of the constructor the user called
  (`d_model`/`nhead` for the nn.Transformer* classes) and at the user's line, chained
  from torch's error, and reports it as every finding is reported (`_reporting.deliver`).
  Any other AssertionError passes through untouched.
- A traced module is checked once per session when it is first entered
  (`entry_violations`), for modules that were never `guard`ed. A false alarm is worse
  than a miss there: HF-style modules declare `hidden_size`, `num_heads` and `head_dim`
  with `heads * head_dim != hidden_size` on purpose (`q_proj: Linear(hidden, heads *
  head_dim)`). So a module is reported only when it would itself have to split a
  d_model-wide tensor into heads: it declares d_model and the head count in its own
  attributes (not only in a config), d_model % heads != 0, and it has a child
  `nn.Linear(d_model, k * d_model)`, k in 1..3 (a projection, or a fused kv/qkv one).

Pure Python at import: torch is imported only where a module is looked at.
"""

from types import SimpleNamespace

from .. import _reporting, _source
from .._errors import ShapeError
from .._names import axes as _axes

_TORCH_MESSAGE = "embed_dim must be divisible by num_heads"
# How torch's constructors that build an nn.MultiheadAttention name d_model and the heads.
_TORCH_NAMES = (("embed_dim", "num_heads"), ("d_model", "nhead"))
_FUSED = (1, 2, 3)  # out_features / d_model of a projection that is split into heads


def _frames(traceback) -> list:
    found = []
    while traceback is not None:
        found.append(traceback)
        traceback = traceback.tb_next
    return found


def _is_torch_file(filename: str) -> bool:
    return _source.TORCH_MODULES in filename


def report_construction_error(error: BaseException, trace) -> ShapeError | None:
    """Report torch's head-count AssertionError that left `trace`'s block as every finding
    is (`_reporting.deliver`: the trace's mode and strictness, a `# shapeguard:
    ignore[head_divisibility]` on the user's line): raise the ShapeError, chained from
    torch's error; or, in warn mode, warn and return it (torch has failed: the caller raises
    it). None when `error` is another one, or the comment on its line silences it (then
    torch's error goes on untouched)."""
    __tracebackhide__ = True
    found = _construction_finding(error)
    if found is None:
        return None
    shape_error, site = found
    found = None
    try:
        return _reporting.deliver(
            shape_error,
            "error",
            mode=trace.mode,
            strict=trace.strict,
            trace=trace,
            filename=site.filename if site else "<shapeguard>",
            lineno=site.lineno if site else 0,
        )
    finally:
        shape_error = None  # no frame -> error cycle (`_reporting.deliver`)


def _construction_finding(error: BaseException):
    """(the ShapeError, the user's site or None) for torch's head-count AssertionError."""
    if type(error) is not AssertionError or str(error) != _TORCH_MESSAGE:
        return None
    frames = _frames(error.__traceback__)
    if not frames:
        return None
    failing = frames[-1].tb_frame
    if failing.f_code.co_name != "__init__" or not _is_torch_file(failing.f_code.co_filename):
        return None  # the same words from somewhere else: not torch's check
    user = None
    for i, tb in enumerate(frames):
        if not _source.is_internal(tb.tb_frame.f_code.co_filename):
            user = i
    site = None
    if user is not None:
        tb = frames[user]
        site = _source.site_at(tb.tb_frame.f_code, tb.tb_lasti, False)
    called = frames[user + 1 :] if user is not None else frames
    for tb in called:  # the outermost torch constructor: the one the user called
        local = tb.tb_frame.f_locals
        for d_attr, h_attr in _TORCH_NAMES:
            d_model, heads = local.get(d_attr), local.get(h_attr)
            if _count(d_model) and _count(heads) and d_model % heads:
                cls = type(local["self"]).__name__ if "self" in local else "MultiheadAttention"
                shape_error = _error(d_attr, d_model, h_attr, heads, cls, site)
                shape_error.__cause__ = error  # as `raise ... from error`
                return shape_error, site
    return None


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _error(d_attr, d_model, h_attr, heads, cls, site) -> ShapeError:
    from ..checks.config import divisibility_violation

    violation = divisibility_violation(d_attr, d_model, h_attr, heads, f" in {cls}(...)")
    return ShapeError(
        violation.relation,
        kind=violation.kind,
        op="__init__",
        module=cls,
        location=site.location if site else "",
        source=site.source if site else "",
        hint=violation.hint,
    )


# -- modules as they are first entered --------------------------------------------------------
def entry_violations(module, where: str):
    """Head-count violations a module shows by its own attributes and projections."""
    if not declares_sizes(module):
        return
    own = {
        name: value
        for name, value in vars(module).items()
        if isinstance(value, int) and not isinstance(value, bool)
    }
    if not own:
        return
    sizes = _axes.declared_sizes(SimpleNamespace(**own))  # no config: the module's own word
    from ..checks.config import check_sizes, divisibility_violation

    if "d_model" in sizes and "heads" in sizes:
        (d_attr, d_model), (h_attr, heads) = sizes["d_model"], sizes["heads"]
        if d_model % heads and _splits_into_heads(module, d_model):
            yield divisibility_violation(d_attr, d_model, h_attr, heads, where)
    if "heads" in sizes and "kv_heads" in sizes:
        yield from check_sizes({k: sizes[k] for k in ("heads", "kv_heads")}, where)


def declares_sizes(module) -> bool:
    """Whether the module's own attributes name any size `entry_violations` reads (most
    modules, a Linear or a norm, name none: nothing to look at)."""
    own = getattr(module, "__dict__", None)
    return type(own) is not dict or bool(own.keys() & _axes.SIZE_ATTRIBUTES)


def _splits_into_heads(module, d_model: int) -> bool:
    from torch import nn

    return any(
        isinstance(child, nn.Linear)
        and child.in_features == d_model
        and child.out_features in tuple(k * d_model for k in _FUSED)
        for child in module.children()
    )


def check_entered(session, module) -> None:
    """Report a module's head-count violations when a session first enters it (raise or
    warn as the trace says), before any of its ops runs."""
    __tracebackhide__ = True
    from .. import _config
    from . import composites as _composites
    from .call import OpCall

    if not declares_sizes(module) or not _config.is_enabled() or _composites.suspended(session):
        return
    path = session.module_path(module)
    cls = type(module).__name__
    where = f" in {path} ({cls})" if path else f" in {cls}"
    for violation in entry_violations(module, where):
        violation.op = "config"
        call = OpCall(session, type(module).__init__, "config", (), {}, _source.user_site())
        session.report(violation, call)
