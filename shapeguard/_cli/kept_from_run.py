"""`shapeguard check FILE --from-run DIR`: the model built from FILE as `check` builds it,
fed the inputs a `shapeguard run --keep-inputs DIR` kept, matched by the model's class.

The model is not rebuilt from the run: re-running the user's program up to a module's
first call would run its side effects again (data loading, training, writing files),
and a model built by a program is in general not rebuildable from anything a run can
safely save. FILE builds it instead (`--model`, `--arg`, as for `check`), with its own
initial weights; the properties the probes test (batch independence, causality, padding)
are the code's, not the weights'.
"""

import functools

import click

from .errors import UsageFailure


def from_run_options(command):
    """`check`'s `--from-run DIR` and `--module NAME`, given to `command` as `inputs_for`
    (None without them). Put under `target_options`: it reads the parsed `target`."""

    @functools.wraps(command)
    def with_inputs(target, from_run, kept_module, **options):
        return command(target, inputs_for=kept_inputs_for(target, from_run, kept_module), **options)

    with_inputs = click.option(
        "--module",
        "kept_module",
        metavar="NAME",
        help="With --from-run: the kept inputs of the module of this class (its name or "
        "module.QualName) instead of the model's own class.",
    )(with_inputs)
    return click.option(
        "--from-run",
        "from_run",
        metavar="DIR",
        help="Feed the model the inputs `shapeguard run --keep-inputs DIR` kept (those of the "
        "module of the model's class), instead of making them up.",
    )(with_inputs)


def kept_crash_hint(inputs) -> str:
    """The hint of a forward that crashed on kept inputs."""
    return (
        f"the inputs are from {inputs.how}; if the file builds the model with other sizes "
        "than the program did, they do not fit it: pass the program's sizes with --arg"
    )


def kept_inputs_for(target, folder: str | None, module_name: str | None):
    """`inputs_for(model)` for `_load_and_run`: the kept inputs as an `Inputs`; None
    without --from-run. Options that make inputs do not go with it (a usage error)."""
    if folder is None:
        if module_name is not None:
            raise UsageFailure("--module NAME picks kept inputs: give --from-run DIR with it")
        return None
    if target.specs or target.dims:
        given = "--input" if target.specs else "--dim"
        raise UsageFailure(f"{given} makes inputs; --from-run takes them all from {folder}")
    if target.device != "cpu":
        raise UsageFailure("--from-run feeds recorded values: run it without --device meta")
    from .kept_inputs import read_index

    read_index(folder)  # a bad DIR is said before the model is built

    def inputs_for(model, device: str = "cpu"):
        from .inputs import Inputs
        from .kept_inputs import load

        kept = load(folder, model, module_name)
        _check_fit(model, kept, folder)
        return Inputs(kept.args, kept.kwargs, kept.how)

    return inputs_for


def _check_fit(model, kept, folder: str) -> None:
    """The kept call binds to the model's forward, or a one-line usage error says why."""
    import inspect

    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return  # no signature to read: the forward itself will say
    try:
        signature.bind(*kept.args, **kept.kwargs)
    except TypeError as error:
        raise UsageFailure(
            f"the inputs kept in {folder} do not fit {type(model).__name__}.forward{signature}: "
            f"{error}"
        ) from None
