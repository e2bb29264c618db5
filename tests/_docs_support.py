"""Helpers for the tests that pin documented messages to real output (golden text).

Set SHAPEGUARD_REGEN=1 to rewrite the documented messages from what shapeguard
prints now, then review the diff: the tests fail on any drift otherwise.
"""

import os
import runpy
import warnings

NOTHING = "(nothing: no finding yet)"


def regen_enabled() -> bool:
    return os.environ.get("SHAPEGUARD_REGEN", "").strip() not in ("", "0")


def capture_messages(run) -> str:
    """What shapeguard says while `run()` runs: each ShapeWarning, then the ShapeError.

    Each message is prefixed the way Python prints it (`shapeguard.ShapeError: ...`);
    messages are separated by blank lines; NOTHING when there is none.
    """
    return capture(run)[0]


def capture(run) -> tuple[str, list[str]]:
    """(the messages as `capture_messages` renders them, the kinds in the same order)."""
    from shapeguard import ShapeError, ShapeWarning

    error = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run()
        except ShapeError as raised:
            error = raised
    shape_warnings = [w.message for w in caught if issubclass(w.category, ShapeWarning)]
    messages = [f"shapeguard.ShapeWarning: {w}" for w in shape_warnings]
    kinds = [w.kind for w in shape_warnings]
    if error is not None:
        messages.append(f"shapeguard.ShapeError: {error}")
        kinds.append(error.kind)
    return "\n\n".join(messages) or NOTHING, kinds


def forget_source(path: str) -> None:
    """Drop cached lines of a file rewritten during this run (regeneration only)."""
    import linecache

    from shapeguard import _source

    linecache.checkcache()
    for name in {key[0] for key in _source._trees}:
        if name.endswith(os.path.basename(path)):
            _source.forget(name)


def run_example(path: str):
    """A callable that builds an example's model and traces one forward of it."""

    def run():
        import shapeguard

        namespace = runpy.run_path(path)
        model = namespace["build_model"]()
        args, kwargs = namespace["example_inputs"]()
        shapeguard.trace(model, *args, **kwargs)

    return run


def run_script(path: str):
    """A callable that runs a script as `python path` would."""

    def run():
        from shapeguard._trace import flash as _flash
        from shapeguard._trace import torch_entries

        # flash-attn and flex_attention names bound by `from ... import` are found by a
        # scan that is cached per set of modules; each snippet is a new namespace, so
        # scan again.
        _flash.forget_scan()
        torch_entries.forget_scan()
        runpy.run_path(path, run_name="__main__")

    return run


def stand_in_xformers() -> dict:
    """STAND-IN `xformers`, `xformers.ops` and `xformers.ops.fmha` modules (the one function
    the catalogue's xformers snippets call, its signature, no kernel) for machines without
    xformers; {} if it imports."""
    import importlib.util
    import types

    if importlib.util.find_spec("xformers") is not None:
        return {}
    import torch

    def memory_efficient_attention(
        query, key, value, attn_bias=None, p=0.0, scale=None, *, op=None, output_dtype=None
    ):
        return torch.empty_like(query)

    memory_efficient_attention.__module__ = "xformers.ops.fmha"
    modules = {}
    for name in ("xformers", "xformers.ops", "xformers.ops.fmha"):
        modules[name] = types.ModuleType(name)
        modules[name].__doc__ = "STAND-IN for xformers, injected by tests/_docs_support.py"
        modules[name].memory_efficient_attention = memory_efficient_attention
    return modules


def stand_in_flash_attn():
    """A STAND-IN `flash_attn` module (same names and signatures, no kernels) for the
    catalogue's flash-attn snippets on machines without flash-attn; None if it imports."""
    import importlib.util
    import types

    if importlib.util.find_spec("flash_attn") is not None:
        return None
    import torch

    module = types.ModuleType("flash_attn")
    module.__doc__ = "STAND-IN for flash-attn, injected by tests/_docs_support.py"

    def flash_attn_func(
        q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
        softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
    ):  # fmt: skip
        return torch.empty_like(q)

    def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False):
        return torch.empty_like(qkv[:, :, 0])

    for func in (flash_attn_func, flash_attn_qkvpacked_func):
        func.__module__ = "flash_attn.flash_attn_interface"
        setattr(module, func.__name__, func)
    return module
