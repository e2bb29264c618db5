"""`shapeguard diff REF [PORT]`: where a port parts ways with its reference (`shapeguard.diff`).

Each file is loaded as `trace` loads one (`-m`: both are module names), its model picked
and the inputs made from the reference's file; `--backends` and `--dtype` compare one
model with itself. Exit status 0 when they agree, 1 on a divergence (or a crash), 2 on a
usage error.
"""

import contextlib
import json

import click

from .errors import Failed, UsageFailure
from .loader import LoadError, ModelCrashed
from .target import write_report


def _pair(value: str | None, option: str, most: int = 2) -> tuple[str, ...] | None:
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if len(parts) < 2 or len(parts) > most:
        said = "two" if most == 2 else "two or more"
        raise UsageFailure(f"{option} {value}: give {said}, separated by a comma (eager,sdpa)")
    return tuple(parts)


def _weights(value: str):
    if value in ("copy", "none"):
        return value
    try:
        with open(value) as f:
            mapping = json.load(f)
    except (OSError, ValueError) as error:
        raise UsageFailure(
            f"--weights {value}: copy, none, or a JSON mapping file ({error})"
        ) from None
    if not isinstance(mapping, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()
    ):
        raise UsageFailure(f"--weights {value}: the file must hold {{ref_name: port_name}}")
    return mapping


@click.command("diff")
@click.argument("ref")
@click.argument("port", required=False)
@click.option("-m", "modules", is_flag=True, help="REF and PORT are module names (pkg.model).")
@click.option("--model", "model_name", metavar="NAME", help="The model to pick in each file.")
@click.option(
    "--backends",
    metavar="A,B[,C...]",
    help="Two or more attn_implementations: eager,sdpa (each compared with the first).",
)
@click.option("--dtype", "dtypes", metavar="A,B", help="Two dtypes: float32,bfloat16.")
@click.option(
    "--weights",
    default="copy",
    show_default=True,
    metavar="copy|none|MAP.json",
    help="Copy the reference's weights into the port by name, then by shape in module "
    "order; none; or a JSON file {ref_name: port_name} tried first.",
)
@click.option("--json", "json_path", metavar="FILE|-", help="Write the JSON report (- : stdout).")
@click.option("--html", "html_path", metavar="FILE", help="Write the HTML report.")
@click.option("--traceback", "show_traceback", is_flag=True, help="Show tracebacks.")
def diff_command(
    ref, port, modules, model_name, backends, dtypes, weights, json_path, html_path, show_traceback
) -> None:
    """Compare PORT with REF on the same seeded inputs and weights; report the first
    aligned tensor (Q, K, V, scores, attn, context, a module's output) that diverges.

    \b
      shapeguard diff ref.py port.py                  a port against its reference
      shapeguard diff model.py --backends eager,sdpa  one transformers model, two backends
      shapeguard diff model.py --backends eager,sdpa,flex_attention   each with the first
      shapeguard diff model.py --dtype float32,bfloat16
    """
    backend_pair = _pair(backends, "--backends", most=len(backends or ""))
    dtype_pair = _pair(dtypes, "--dtype")
    if port is None and backend_pair is None and dtype_pair is None:
        raise UsageFailure("give PORT, or --backends / --dtype to compare REF with itself")
    mapping = _weights(weights)
    result = _run(ref, port, modules, model_name, backend_pair, dtype_pair, mapping,
                  show_traceback)  # fmt: skip
    if html_path:
        from .._diff.html import render_diff_html
        from .._diff.result_set import DiffSet

        # Three or more backends: the page shows the first pair that diverges.
        shown = result.shown if isinstance(result, DiffSet) else result
        write_report(html_path, render_diff_html(shown))
    if json_path == "-":
        click.echo(result.to_json())
    else:
        if json_path:
            write_report(json_path, result.to_json() + "\n")
        click.echo(str(result), nl=False)
    if not result.agree:
        raise Failed(f"{result.port_name} diverges from {result.ref_name}")


def _run(ref, port, modules, model_name, backends, dtypes, weights, show_traceback):
    from .._diff.engine import DiffOptionError, diff
    from .._diff.weights import WeightsError
    from . import inputs as _inputs
    from . import loader as _loader
    from . import picking as _picking
    from .target import quiet_torch

    quiet_torch()

    def load(stack, name):
        where = {"module": name} if modules else {"path": name}
        module = stack.enter_context(_loader.loaded(**where))
        return module, _picking.pick_model(module, name=model_name, kwargs={}, device="cpu")

    try:
        with contextlib.ExitStack() as stack:
            module, ref_picked = load(stack, ref)
            made = _inputs.make_inputs(module, ref_picked.model, device="cpu")
            port_model = load(stack, port)[1].model if port else None
            return diff(
                ref_picked.model, port_model, *made.args, weights=weights,
                backends=backends, dtypes=dtypes, **made.kwargs,
            )  # fmt: skip
    except (LoadError, WeightsError, DiffOptionError) as error:
        raise UsageFailure(str(error), error, show_traceback) from None
    except ModelCrashed as error:
        raise Failed(f"the model crashed: {error.phase}", error, show_traceback) from None
    except Exception as error:  # the forward of either side raised
        line = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        raise Failed(f"the model crashed: {line}", error, show_traceback) from None
