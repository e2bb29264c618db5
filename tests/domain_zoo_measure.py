"""Running the domain zoo (tests/domain_zoo.py) through shapeguard: what the trace finds, what
check's probes say, and the outcome for a bug. Shared by tests/test_domain_zoo.py and
bench/domain_zoo.py, so the test pins what the bench measures."""

import warnings

import domain_zoo
import torch

import shapeguard
from shapeguard import ShapeError, ShapeWarning


def build(arch: domain_zoo.Arch, sizes: domain_zoo.Sizes, bug: str | None):
    """The module (eval mode, seeded) and one forward's inputs."""
    torch.manual_seed(0)
    module = arch.build(sizes, bug).eval()
    return module, arch.inputs(sizes)


def first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


def run_trace(module, inputs) -> dict:
    """The trace's findings (kind, location, headline, message) in warn mode, and the error it
    raised: a ShapeError with its kind and location, or torch's own passed through."""
    found, error = [], None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        trace = shapeguard.trace(mode="warn")
        try:
            with trace:
                module(*inputs)
        except ShapeError as e:
            error = {"kind": e.kind, "location": e.location, "headline": first_line(e)}
            error["message"] = str(e)
        except Exception as e:  # torch's own error
            error = {"kind": type(e).__name__, "location": "", "headline": first_line(e)}
            error["message"] = str(e)
    for f in trace.findings:
        found.append(
            {"kind": f.kind, "location": f.location, "headline": f.headline, "message": f.message}
        )
    return {"findings": found, "error": error}


def hits(traced: dict) -> list[dict]:
    """The findings, and the error where it points at a line."""
    error = traced["error"]
    return traced["findings"] + ([error] if error and error["location"] else [])


def run_check(module, inputs) -> dict:
    """check's probes: the names of those that failed, held (passed) and were inconclusive."""
    probes = shapeguard.check(module, *inputs).probes
    return {
        status: [r.name for r in probes if r.status == status]
        for status in ("failed", "passed", "inconclusive")
    }


def loud(module, inputs) -> str:
    """torch's own error on a plain forward ("" when it runs)."""
    try:
        with torch.no_grad():
            module(*inputs)
    except Exception as e:
        return first_line(e)
    return ""


def about(bug: domain_zoo.Bug, traced: dict) -> list[dict]:
    """The trace's hits on the bug's marked lines."""
    return [h for h in hits(traced) if domain_zoo.about_the_bug(bug, h["location"])]


def outcome(bug: domain_zoo.Bug, traced: dict, checked: dict | None, correct_failed) -> str:
    """ "trace" when a hit is on the bug's lines; else "check" when a probe failed that did not
    fail on the correct counterpart at the same size (`correct_failed`); else "miss"."""
    if about(bug, traced):
        return "trace"
    if checked is not None and set(checked["failed"]) - set(correct_failed):
        return "check"
    return "miss"
