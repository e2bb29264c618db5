"""The runs of one configuration: plain (twice), warn-mode trace, raise-mode trace, guard;
`generate` three ways; `check` once. Each returns a JSON-ready dict.

Every forward runs in eval mode under `no_grad`, from the same RNG state, so a model that
draws random numbers (ViT-MAE's masking) draws the same ones each time.
"""

import traceback
import warnings

import torch
from _world_compare import count, differences

import shapeguard

SEED = 0


def _call(fn):
    torch.manual_seed(SEED)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


def error_text(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip().splitlines()
    return text[0][:300] if text else type(error).__name__


def where(error: BaseException) -> str:
    """The innermost frame of the error, `file:line`, for a crash's report."""
    frames = traceback.extract_tb(error.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def findings_of(findings) -> list:
    """Findings merged by kind: [{kind, severity, count, message}] (the first message)."""
    out: dict = {}
    for f in findings:
        entry = out.setdefault(
            f.kind, {"kind": f.kind, "severity": f.severity, "count": 0, "message": f.message}
        )
        entry["count"] += getattr(f, "count", 1)
    return sorted(out.values(), key=lambda e: e["kind"])


def _is_shape_error(error: BaseException) -> bool:
    return isinstance(error, (shapeguard.ShapeError, shapeguard.ContractError))


def run_config(model, args, kwargs, *, guard=True) -> dict:
    """One configuration. `plain_error` set: the model itself fails here (nothing counted).
    `guard` False leaves the guarded forward out (the sweep guards at sizes d only: the
    guard runs the same checks as the raise-mode trace)."""
    out: dict = {}
    forward = lambda: model(*args, **kwargs)  # noqa: E731
    try:
        plain = _call(forward)
    except Exception as error:  # the model's own failure: recorded, not counted
        out["plain_error"] = error_text(error)
        return out
    again = _call(forward)
    out["deterministic"] = not differences(plain, again)
    out["tensors"] = count(plain)
    # Warn mode: findings, ShapeWarnings, bit-identical outputs.
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.manual_seed(SEED)
            with torch.no_grad(), shapeguard.trace(mode="warn") as trace:
                traced = model(*args, **kwargs)
        out["findings"] = findings_of(trace.findings)
        out["shape_warnings"] = sum(issubclass(w.category, shapeguard.ShapeWarning) for w in caught)
        if out["deterministic"]:
            out["differences"] = differences(plain, traced)
    except Exception as error:
        out["crash"] = {"mode": "warn", "error": error_text(error), "where": where(error)}
    # Raise mode, as `shapeguard.trace(model, **inputs)`.
    try:
        _call(lambda: shapeguard.trace(model, *args, **kwargs))
    except Exception as error:
        if _is_shape_error(error):
            out["raise"] = error_text(error)
        else:
            out.setdefault(
                "crash", {"mode": "raise", "error": error_text(error), "where": where(error)}
            )
    # guard: raise mode, on the instance; outputs bit-identical, hooks removed after.
    if not guard:
        return out
    try:
        shapeguard.guard(model)
        try:
            guarded = _call(forward)
        finally:
            shapeguard.unguard(model)
        if out["deterministic"]:
            out["guard_differences"] = differences(plain, guarded)
    except Exception as error:
        if _is_shape_error(error):
            out["guard_raise"] = error_text(error)
        else:
            out.setdefault(
                "crash", {"mode": "guard", "error": error_text(error), "where": where(error)}
            )
    return out


def _tokens(result):
    return result.sequences if hasattr(result, "sequences") else result


def run_generate(model, inputs, pad_id) -> dict:
    """`generate` plain, inside a warn-mode trace and guarded: the same tokens, findings."""
    options = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=pad_id)
    generate = lambda: model.generate(**inputs, **options)  # noqa: E731
    out: dict = {}
    try:
        plain = _tokens(_call(generate))
    except Exception as error:
        out["plain_error"] = error_text(error)
        return out
    out["deterministic"] = torch.equal(plain, _tokens(_call(generate)))
    try:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            torch.manual_seed(SEED)
            with torch.no_grad(), shapeguard.trace(mode="warn") as trace:
                traced = _tokens(model.generate(**inputs, **options))
        out["findings"] = findings_of(trace.findings)
        out["trace_same"] = torch.equal(plain, traced)
    except Exception as error:
        out["crash"] = {"mode": "warn", "error": error_text(error), "where": where(error)}
    try:
        shapeguard.guard(model, mode="raise")
        try:
            guarded = _tokens(_call(generate))
        finally:
            shapeguard.unguard(model)
        out["guard_same"] = torch.equal(plain, guarded)
    except Exception as error:
        if _is_shape_error(error):
            out["guard_raise"] = error_text(error)
        else:
            out.setdefault(
                "crash", {"mode": "guard", "error": error_text(error), "where": where(error)}
            )
    return out


def outcome(result) -> str:
    """passed, failed, n/a (not applicable by design) or inconclusive (anything else: a
    probe that could not run, or a third status the probes report)."""
    status = str(getattr(result, "status", ""))
    if status in ("passed", "failed"):
        return status
    if status == "skipped" and getattr(result, "applicable", True) is False:
        return "n/a"
    return "inconclusive"


def run_check(model, args, kwargs) -> dict:
    """`shapeguard.check` once; then the model's own outputs against those before it."""
    before = _call(lambda: model(*args, **kwargs))
    out: dict = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = shapeguard.check(model, *args, **kwargs)
        out["verdict"] = str(report.verdict)
        out["probes"] = [
            {
                "name": r.name,
                "status": str(r.status),
                "outcome": outcome(r),
                "message": (r.message or "").splitlines()[0][:300] if r.message else "",
            }
            for r in report.results
        ]
        out["findings"] = findings_of(report.findings)
    except Exception as error:
        out["crash"] = {"error": error_text(error), "where": where(error)}
    after = _call(lambda: model(*args, **kwargs))
    out["differences_after"] = differences(before, after)
    return out
