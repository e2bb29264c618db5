"""The rows of `shapeguard check`'s summary: the trace's result, then each semantic probe's.

A row is `(check, status, detail)` with status `pass`, `FAIL` or `skip`; details are
the full messages of failures, printed under the table. The probes come from
whichever module provides them (`probe_runner`), so the summary reads their results
in several shapes (`probe_rows`).
"""

import contextlib

from .report.text import summary_line


def summary_rows(
    model, inputs, run, device: str, *, find_runner, progress=None
) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(rows, details) for one traced forward (`_run.Run`) and the probes run after it.

    Args:
        find_runner: returns the probe runner (`probe_runner`), or None; called only
            when the probes can run.
        progress: `progress(model, description)`, a context manager around the probes.
    """
    trace = run.trace
    rows = [("trace", "FAIL" if trace.findings else "pass", summary_line(trace))]
    rows += [(f.kind, "FAIL", f.message.splitlines()[0]) for f in trace.findings]
    details = [f.message for f in trace.findings]
    more_rows, more_details = _run_probes(model, inputs, run, device, find_runner, progress)
    return rows + more_rows, details + more_details


def _run_probes(model, inputs, run, device: str, find_runner, progress):
    from ._errors import ShapeError

    if device == "meta":
        return [
            ("semantic probes", "skip", "probes compare real values; run without --device meta")
        ], []
    if run.failed:
        return [("semantic probes", "skip", "the trace failed; fix that first")], []
    runner = find_runner()
    if runner is None:
        return [("semantic probes", "skip", "not available in this version of shapeguard")], []
    try:
        with progress(model, "probing") if progress else contextlib.nullcontext():
            result = runner(model, inputs.args, inputs.kwargs)
    except ShapeError as error:
        return [(error.kind, "FAIL", error.relation)], [error.render()]
    except Exception as error:
        first = str(error).splitlines()[0] if str(error) else ""
        return [("semantic probes", "FAIL", f"raised {type(error).__name__}: {first}")], []
    # The probes' own "shape checks" row repeats the trace row above.
    rows = [row for row in probe_rows(result) if row[0] != "shape checks"]
    details = [message for _, status, message in rows if status == "FAIL" and "\n" in message]
    rows = [
        (name, status, message.splitlines()[0] if message else "") for name, status, message in rows
    ]
    return rows, details


def probe_runner():
    """The semantic probes as `f(model, args, kwargs)`, or None when not installed.

    Prefers `shapeguard._check.run_check(model, args: tuple, kwargs: dict)`; falls back
    to a `check(model, *args, **kwargs)` in `shapeguard._check` or `shapeguard._probes`.
    """
    import importlib

    for module_name in ("_check", "_probes"):
        full = f"{__package__}.{module_name}"
        try:
            module = importlib.import_module(full)
        except ModuleNotFoundError as error:
            if error.name == full:
                continue
            raise
        run_check = getattr(module, "run_check", None)
        if callable(run_check):
            return lambda model, args, kwargs: run_check(model, args, kwargs)
        check_fn = getattr(module, "check", None)
        if callable(check_fn):
            return lambda model, args, kwargs: check_fn(model, *args, **kwargs)
    return None


_STATUS = {
    "passed": "pass",
    "ok": "pass",
    "failed": "FAIL",
    "fail": "FAIL",
    "skipped": "skip",
    "error": "FAIL",
}


def probe_rows(result) -> list[tuple[str, str, str]]:
    """(name, status, message) for each probe in whatever the probe runner returned.

    Accepts an object with `.results` (or `.probes`, `.findings`), or an iterable of
    items with `name`, a status (`passed` / `ok` bool, or `status` string, or a
    `severity`), and `message`; dicts with the same keys work too.
    """
    items = result
    for attr in ("results", "probes", "findings"):
        if hasattr(result, attr):
            items = getattr(result, attr)
            break
    if items is None:
        return []
    if isinstance(items, dict):
        items = list(items.values())
    if not isinstance(items, list | tuple):
        try:
            items = list(items)
        except TypeError:
            items = [items]
    rows = []
    for item in items:
        get = item.get if isinstance(item, dict) else (lambda k, d=None, _i=item: getattr(_i, k, d))
        name = get("name") or get("probe") or get("kind") or type(item).__name__
        status = get("status")
        if status is None:
            passed = get("passed", get("ok"))
            if passed is None:
                passed = get("severity", "error") != "error"
            status = "pass" if passed else "FAIL"
        status = _STATUS.get(str(status).lower(), str(status))
        message = get("message") or get("detail") or ""
        rows.append((str(name), status, str(message)))
    return rows
