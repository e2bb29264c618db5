"""torch's attention functions that no TorchFunctionMode sees, wrapped while a session is
open: `flex_attention` (a Python function over a higher-order op that it runs compiled,
so the mode meets only dynamo's trace of it) and `varlen_attn`; and xformers'
`memory_efficient_attention`. Each call is then checked
before it runs (`checks/flex.py`) and recorded as one event. Never imported here: only a
module the user already loaded is wrapped.

Code compiled by torch.compile runs with the interceptor off the mode stack
(`interceptor.off_stack`): dynamo guards a compiled frame on the modes on the stack, so
under the interceptor it would compile the frame once more and, past its recompile limit,
run it eagerly, with output that can differ in the last bits from the untraced call's.
`flex_attention` runs its kernel compiled; transformers' `compile_friendly_flex_attention`
calls a `torch.compile(flex_attention)` made once, outside the trace's reach, so it is not
checked, only run off the stack; `create_block_mask(..., _compile=True)` (transformers'
masks) compiles itself."""

import sys

from .rebinding import Rebinder, wrap, wrap_unchecked

CHECKED, CHECKED_COMPILED, COMPILED = "checked", "checked, runs compiled", "runs compiled"
COMPILED_IF = "runs compiled given _compile=True"

# (module, function, how it is wrapped): entry points a mode cannot see.
ENTRY_POINTS = (
    ("torch.nn.attention.flex_attention", "flex_attention", CHECKED_COMPILED),
    ("torch.nn.attention.varlen", "varlen_attn", CHECKED),
    # xformers' (`checks/xformers.py`): a Python function over its own dispatch, which
    # fails on a CPU after the check and the reach were read.
    ("xformers.ops.fmha", "memory_efficient_attention", CHECKED),
    # transformers' FlexAttention path: its compiled flex_attention, made on the first call.
    ("transformers.integrations.flex_attention", "compile_friendly_flex_attention", COMPILED),
    ("torch.nn.attention.flex_attention", "create_block_mask", COMPILED_IF),
)


def _loaded() -> dict[int, object]:
    found = {}
    for module_name, name, _how in ENTRY_POINTS:
        func = getattr(sys.modules.get(module_name), name, None)
        if callable(func):
            found[id(func)] = func
    return found


def _wrapper(func):
    how = next(
        (
            how
            for module_name, name, how in ENTRY_POINTS
            if getattr(sys.modules.get(module_name), name, None) is func
        ),
        CHECKED,
    )
    if how in (COMPILED, COMPILED_IF):
        return wrap_unchecked(func, "_compile" if how == COMPILED_IF else None)
    return wrap(func, compiled=how == CHECKED_COMPILED)


_rebinder = Rebinder(_loaded, wrapper=_wrapper)
patch = _rebinder.patch
restore = _rebinder.restore
forget_scan = _rebinder.forget_scan
