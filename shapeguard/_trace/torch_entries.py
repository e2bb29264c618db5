"""torch's attention functions that no TorchFunctionMode sees, wrapped while a session is
open: `flex_attention` (a Python function over a higher-order op that it runs compiled,
so the mode meets only dynamo's trace of it) and `varlen_attn`; and xformers'
`memory_efficient_attention`. Each call is then checked
before it runs (`checks/flex.py`) and recorded as one event. Never imported here: only a
module the user already loaded is wrapped."""

import sys

from .rebinding import Rebinder

# (module, function): torch's public attention entry points a mode cannot see.
ENTRY_POINTS = (
    ("torch.nn.attention.flex_attention", "flex_attention"),
    ("torch.nn.attention.varlen", "varlen_attn"),
    # xformers' (`checks/xformers.py`): a Python function over its own dispatch, which
    # fails on a CPU after the check and the reach were read.
    ("xformers.ops.fmha", "memory_efficient_attention"),
)


def _loaded() -> dict[int, object]:
    found = {}
    for module_name, name in ENTRY_POINTS:
        func = getattr(sys.modules.get(module_name), name, None)
        if callable(func):
            found[id(func)] = func
    return found


_rebinder = Rebinder(_loaded)
patch = _rebinder.patch
restore = _rebinder.restore
forget_scan = _rebinder.forget_scan
