"""The pytest plugin: run tests inside a shapeguard trace and fail them on shape violations.

Registered under the `pytest11` entry point as `shapeguard` (`-p no:shapeguard` turns it
off; its ini keys stay declared by `_plugin.ini`, an entry point of its own). It does nothing until asked: `--shapeguard` or the ini key `shapeguard = true` for
every test, `@pytest.mark.shapeguard(mode=..., strict=...)` for one test or module,
`@pytest.mark.no_shapeguard` to opt one out. torch is imported by the first traced test
(`Trace.__enter__` loads the session), never by loading the plugin.

Only the call phase is traced: a hook wrapper around `pytest_runtest_call` opens the
test's `Trace` as a context manager, so the interception is removed whatever the
outcome, and fixtures (model building, data loading) stay outside the record.
"""

import os
import warnings
from dataclasses import dataclass

import pytest

from .._config import MODES, is_enabled
from .._errors import Finding, ShapeWarning
from .._public_trace import Trace
from .._trace.record import Event
from .ini import MARKERS, add_ini_keys

_LAST_OPS = 10  # ops listed before the violation in the report section
_MARKER_ARGS = ("mode", "strict")


@dataclass(frozen=True, slots=True)
class _Settings:
    """The run's settings, from the command line and the ini file."""

    enabled: bool  # every test is traced, unless it opts out
    mode: str
    strict: bool


@dataclass(slots=True)
class _Totals:
    """Counts summed over the run's traced tests, for the summary line."""

    tests: int = 0
    modules: int = 0
    ops: int = 0
    violations: int = 0
    warnings: int = 0


@dataclass(slots=True)
class _Plan:
    """What the plugin does for one test."""

    trace: Trace
    checked: bool  # findings fail the test
    traced: bool  # a session is open during the call (checked, or the fixture asked)
    opened: bool = False


_SETTINGS = pytest.StashKey[_Settings]()
_TOTALS = pytest.StashKey[_Totals]()
_PLAN = pytest.StashKey[_Plan]()


# -- options and settings -------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("shapeguard", "shapeguard: shape checks for PyTorch attention code")
    group.addoption(
        "--shapeguard",
        action="store_true",
        default=None,
        help="run every test inside a shapeguard trace: a shape violation fails the test, "
        "even when the code under test catches it (ini: shapeguard).",
    )
    group.addoption(
        "--shapeguard-mode",
        choices=MODES,
        default=None,
        help="raise: a violation raises ShapeError where it happens; warn: the code keeps "
        "running and the test fails at its end. Implies --shapeguard. "
        "Default: raise (ini: shapeguard_mode).",
    )
    group.addoption(
        "--shapeguard-strict",
        action="store_true",
        default=None,
        help="ShapeWarnings (legal but suspicious shapes) fail the test too; without it they "
        "are reported and never raised. Implies --shapeguard (ini: shapeguard_strict).",
    )
    # Also declared by `_plugin.ini` (its own entry point), which `-p no:shapeguard` leaves on.
    add_ini_keys(parser)


def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    mode_option = config.getoption("shapeguard_mode")
    strict_option = config.getoption("shapeguard_strict")
    mode = mode_option or str(config.getini("shapeguard_mode")).strip()
    if mode not in MODES:
        raise pytest.UsageError(
            f"shapeguard_mode = {mode!r} in the ini file is not a shapeguard mode; "
            f"use one of: {', '.join(MODES)}"
        )
    # The command-line mode and strict flags would do nothing on their own, so asking
    # for them turns the plugin on; their ini twins only set defaults.
    enabled = bool(
        config.getoption("shapeguard")
        or mode_option
        or strict_option
        or config.getini("shapeguard")
    )
    config.stash[_SETTINGS] = _Settings(
        enabled=enabled, mode=mode, strict=bool(strict_option or config.getini("shapeguard_strict"))
    )
    totals = config.stash[_TOTALS] = _Totals()
    config.pluginmanager.register(_Counter(totals), "shapeguard-counter")


def pytest_report_header(config: pytest.Config) -> str | None:
    settings = config.stash[_SETTINGS]
    if not settings.enabled:
        return None
    if not is_enabled():
        return "shapeguard: off (SHAPEGUARD=0 in the environment, or shapeguard.disable())"
    strict = ", strict" if settings.strict else ""
    return f"shapeguard: on (mode={settings.mode}{strict})"


# -- markers ----------------------------------------------------------------------------
def _marker_options(mark: pytest.Mark) -> dict:
    """The validated keyword arguments of one `shapeguard` / `no_shapeguard` marker."""
    spelled = "@pytest.mark." + mark.name
    if mark.name == "no_shapeguard":
        if mark.args or mark.kwargs:
            raise _BadMarker(f"{spelled} takes no arguments")
        return {}
    if mark.args:
        given = ", ".join(repr(a) for a in mark.args)
        raise _BadMarker(
            f"{spelled} takes keyword arguments only (mode=..., strict=...); got {given}"
        )
    unknown = sorted(set(mark.kwargs) - set(_MARKER_ARGS))
    if unknown:
        names = ", ".join(repr(n) for n in unknown)
        raise _BadMarker(f"{spelled} got unknown argument(s) {names}; it takes mode= and strict=")
    mode = mark.kwargs.get("mode", None)
    if mode is not None and mode not in MODES:
        raise _BadMarker(f"{spelled}(mode={mode!r}): mode must be one of: {', '.join(MODES)}")
    strict = mark.kwargs.get("strict", None)
    if strict is not None and not isinstance(strict, bool):
        raise _BadMarker(f"{spelled}(strict={strict!r}): strict must be True or False")
    return dict(mark.kwargs)


class _BadMarker(Exception):
    pass


def _plan_for(item: pytest.Item, settings: _Settings) -> _Plan:
    """Decide, from the markers closest to the test first, whether and how to trace it."""
    on: bool | None = None
    options: dict = {}
    for mark in item.iter_markers():
        if mark.name not in ("shapeguard", "no_shapeguard"):
            continue
        found = _marker_options(mark)
        if on is None:
            on = mark.name == "shapeguard"
        for key, value in found.items():
            options.setdefault(key, value)  # a closer marker wins
    checked = settings.enabled if on is None else on
    # A background trace: traces and guarded modules that the test opens itself keep
    # their own options, and their findings still reach this one (and fail the test).
    trace = Trace(
        mode=options.get("mode", settings.mode),
        strict=options.get("strict", settings.strict),
        background=True,
    )
    return _Plan(trace=trace, checked=checked, traced=checked)


# -- the test's life --------------------------------------------------------------------
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # First, so that a bad marker fails the test before its fixtures run, and the
    # `shapeguard` fixture finds the plan.
    try:
        item.stash[_PLAN] = _plan_for(item, item.config.stash[_SETTINGS])
    except _BadMarker as error:
        pytest.fail(str(error), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    plan = item.stash.get(_PLAN, None)
    if plan is None or not plan.traced or not is_enabled():
        return (yield)
    trace = plan.trace
    with warnings.catch_warnings():
        # The plugin, not the warning filters, decides what fails: a ShapeWarning is
        # reported (pytest's warnings summary, our summary line) and fails the test
        # only when strict, at its end, even under `filterwarnings = error`.
        # `pytest.warns` and the test's own filters still win: they are set inside.
        warnings.filterwarnings("always", category=ShapeWarning)
        with trace:
            plan.opened = True
            result = yield
    from .. import _suppress

    _suppress.apply(trace)
    if plan.checked:
        _fail_on_findings(trace)
    return result


def _failing(trace: Trace) -> list[Finding]:
    return [f for f in trace.findings if f.severity == "error" or trace.strict]


def _fail_on_findings(trace: Trace) -> None:
    """Fail a test that returned normally although its trace recorded a violation."""
    __tracebackhide__ = True
    failing = _failing(trace)
    if not failing:
        return
    first = failing[0]
    name = "ShapeError" if first.severity == "error" else "ShapeWarning (strict)"
    if trace.mode == "raise" or first.kind == "torch_error":
        why = "the code under test caught this error; shapeguard fails the test anyway"
    else:
        why = "mode=warn let the code run on; shapeguard fails the test at its end"
    lines = [f"shapeguard.{name}: {first.message}", f"({why})"]
    if len(failing) > 1:
        lines.append(f"({len(failing) - 1} more in the shapeguard section below)")
    pytest.fail("\n".join(lines), pytrace=False)


@pytest.fixture
def shapeguard(request: pytest.FixtureRequest) -> Trace:
    """The shapeguard Trace of the current test, filled in while the test runs.

    Asking for it traces the test even where the plugin is off; its findings then fail
    the test only where the plugin is on for it (`--shapeguard`, the marker), so a test
    marked `no_shapeguard` can assert on the violations it provokes.

    Example::

        def test_scores(shapeguard):
            model(x)
            assert shapeguard.shape_of("scores") == (2, 3, 5, 7)
    """
    plan = request.node.stash[_PLAN]  # made by our setup hook, before any fixture
    plan.traced = True
    return plan.trace


@pytest.fixture
def shapeguard_fake_tp():
    """`shapeguard.distributed.fake_tp`: play one rank of a tensor-parallel run in the test's
    process, on torch's fake process group (destroyed when the block ends).

    Example::

        def test_tp2(shapeguard_fake_tp):
            with shapeguard_fake_tp(2) as mesh:
                model = parallelize_module(Attention(), mesh, plan)
                model(x)
    """
    from ..distributed import fake_tp

    return fake_tp


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    plan = item.stash.get(_PLAN, None)
    if call.when == "call" and plan is not None and plan.opened:
        trace = plan.trace
        # A plain attribute of builtins: pytest-xdist serializes it with the report,
        # so the controller can sum the workers' counts.
        report.shapeguard_counts = {
            "modules": trace.modules_seen,
            "ops": trace.event_count + trace.dropped_events,  # counted, not built
            "violations": len(trace.errors),
            "warnings": len(trace.warnings),
        }
        if trace.findings:
            report.sections.append(("shapeguard", _section(trace, str(item.config.rootpath))))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item):
    try:
        return (yield)
    finally:
        # The fixture is finalized by now: drop the trace so a long run does not keep
        # every test's events alive.
        if _PLAN in item.stash:
            del item.stash[_PLAN]


# -- reporting --------------------------------------------------------------------------
def _section(trace: Trace, rootpath: str) -> str:
    """The report section: the first violation, the other findings, and the ops before it."""
    failing = _failing(trace)
    first = failing[0] if failing else trace.findings[0]
    lines = [first.message]
    others = [f for f in trace.findings if f is not first]
    if others:
        lines += ["", "other findings:"]
        lines += [
            f"  {f.severity} at {_short(f.location, rootpath)}: {f.message.splitlines()[0]}"
            for f in others
        ]
    end = len(trace.events) if first.event_index is None else first.event_index
    before = trace.events[:end][-_LAST_OPS:]
    lines.append("")
    if before:
        lines.append(f"last {len(before)} of {end} ops before it:")
        lines += _op_lines(before, rootpath)
    else:
        lines.append("no op ran before it")
    return "\n".join(lines)


def _op_lines(events: list[Event], rootpath: str) -> list[str]:
    rows = []
    for event in events:
        out = event.outputs[0] if event.outputs else None
        module = f"{event.module} ({event.module_type})" if event.module else event.module_type
        rows.append(
            (
                str(event.index),
                event.op,
                module or "-",
                _short(event.location, rootpath) or "-",
                (out.label or out.role or "") if out else "",
                out.named_shape if out else "",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for index, *cells in rows:
        padded = [index.rjust(widths[0])]
        padded += [cell.ljust(width) for cell, width in zip(cells, widths[1:], strict=True)]
        lines.append(("  " + "  ".join(padded)).rstrip())
    return lines


def _short(location: str, rootpath: str) -> str:
    """`file:line` relative to the rootdir when the file is under it."""
    path, sep, line = location.rpartition(":")
    if not sep or not os.path.isabs(path):
        return location
    relative = os.path.relpath(path, rootpath)
    return location if relative.startswith("..") else f"{relative}:{line}"


class _Counter:
    """Sums the counts that traced tests attach to their call reports.

    `pytest_runtest_logreport` gets no config, so this object, made per config,
    holds the totals. In an xdist controller it sees the workers' reports too.
    """

    def __init__(self, totals: _Totals) -> None:
        self.totals = totals

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        counts = getattr(report, "shapeguard_counts", None)
        if not isinstance(counts, dict):
            return
        totals = self.totals
        totals.tests += 1
        totals.modules += int(counts.get("modules", 0))
        totals.ops += int(counts.get("ops", 0))
        totals.violations += int(counts.get("violations", 0))
        totals.warnings += int(counts.get("warnings", 0))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    settings = config.stash.get(_SETTINGS, None)
    totals = config.stash.get(_TOTALS, None)
    if settings is None or totals is None or (not settings.enabled and totals.tests == 0):
        return
    terminalreporter.write_line(_summary_line(totals))


def _summary_line(totals: _Totals) -> str:
    return (
        f"shapeguard: {_plural(totals.tests, 'test')} traced, "
        f"{_plural(totals.modules, 'module')} and {_plural(totals.ops, 'op')} checked, "
        f"{_plural(totals.violations, 'violation')}, {_plural(totals.warnings, 'warning')}"
    )


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"
