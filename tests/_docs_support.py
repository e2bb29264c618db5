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
    from shapeguard import ShapeError, ShapeWarning

    error = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run()
        except ShapeError as raised:
            error = raised
    messages = [
        f"shapeguard.ShapeWarning: {w.message}" for w in caught if issubclass(w.category, ShapeWarning)
    ]
    if error is not None:
        messages.append(f"shapeguard.ShapeError: {error}")
    return "\n\n".join(messages) or NOTHING


def forget_source(path: str) -> None:
    """Drop cached lines of a file rewritten during this run (regeneration only)."""
    import linecache

    from shapeguard import _source

    linecache.checkcache()
    for name in list(_source._file_cache):
        if name.endswith(os.path.basename(path)):
            del _source._file_cache[name]


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
    return lambda: runpy.run_path(path, run_name="__main__")
