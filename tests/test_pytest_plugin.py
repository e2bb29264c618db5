"""The pytest plugin, tested by running real pytest sessions with pytester.

The inner sessions run a little cross-attention (batch 2, heads 3, seq_q 5, seq_k 7,
d_k 11, d_model 33) that breaks shape contracts on purpose, so this module opts out of
the outer run's plugin: its tests pass with and without `--shapeguard`.
"""

import re

import pytest

pytestmark = pytest.mark.no_shapeguard


@pytest.fixture(scope="module", autouse=True)
def _imports_outlive_the_inner_runs():
    """Import here what the inner runs would import, before pytester snapshots sys.modules.

    pytester drops the modules an in-process run imports: torch cannot be imported twice,
    and hypothesis (its plugin imports it at the end of every run) would cost seconds a run.
    """
    import hypothesis  # noqa: F401
    import torch  # noqa: F401

    from shapeguard.checks import checkers_for

    checkers_for("matmul")  # loads every check family


ATTENTION = '''
"""A little cross-attention: batch 2, heads 3, seq_q 5, seq_k 7, d_k 11 (d_model 33)."""

import math

import torch


class Attention(torch.nn.Module):
    def __init__(self, d_model=33, n_heads=3, softmax_dim=-1):
        super().__init__()
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.softmax_dim = softmax_dim
        self.W_q = torch.nn.Linear(d_model, d_model)
        self.W_k = torch.nn.Linear(d_model, d_model)
        self.W_v = torch.nn.Linear(d_model, d_model)

    def forward(self, x, memory):
        B, T, _ = x.shape
        S = memory.shape[1]
        Q = self.W_q(x).view(B, T, self.n_heads, self.d_k).transpose(1, 2)
        K = self.W_k(memory).view(B, S, self.n_heads, self.d_k).transpose(1, 2)
        V = self.W_v(memory).view(B, S, self.n_heads, self.d_k).transpose(1, 2)
        scores = self.scores(Q, K)
        attn = torch.softmax(scores, dim=self.softmax_dim)
        return attn @ V

    def scores(self, Q, K):
        scores = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)
        return scores


class KNotTransposed(Attention):
    def scores(self, Q, K):
        scores = Q @ K / math.sqrt(self.d_k)
        return scores


def inputs():
    return torch.randn(2, 5, 33), torch.randn(2, 7, 33)
'''

HEADER = "from attention import Attention, KNotTransposed, inputs\nimport pytest\n\n"

PASSING = """
def test_ok():
    out = Attention()(*inputs())
    assert out.shape == (2, 3, 5, 11)
"""

SWALLOWED = """
def test_swallowed():
    try:
        KNotTransposed()(*inputs())
    except RuntimeError:
        pass
"""

# The first line of the message for K not transposed, as fnmatch patterns.
RELATION = "*scores = Q @ K: Q.d_k (11) != K.seq_k (7)"
HINT = "*hint: K was not transposed: use Q @ K.transpose(-2, -1)"
# Cross-attention's softmax over the queries is reported where the weights are summed over the
# keys (`aggregation_axis`): slot attention renormalises over the keys in between, correctly.
SOFTMAX = "*attn @ V sums attn over dim -1 (seq_k=7), but its softmax made it sum to 1 over dim -2*"


@pytest.fixture
def tester(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(attention=ATTENTION)
    return pytester


def write_tests(pytester: pytest.Pytester, body: str, name: str = "test_attn") -> None:
    pytester.makepyfile(**{name: HEADER + body})


def section(stdout: str, title: str = "shapeguard") -> list[str]:
    """The lines of the first report section called `title`."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if re.fullmatch(rf"-+ {title} -+", line))
    rest = lines[start + 1 :]
    end = next(
        (i for i, line in enumerate(rest) if re.fullmatch(r"[-=_]+ .* [-=_]+", line)), len(rest)
    )
    return rest[:end]


# -- on and off ---------------------------------------------------------------------------
def test_passing_test_passes_with_header_and_summary(tester):
    write_tests(tester, PASSING)
    result = tester.runpytest("--shapeguard")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "shapeguard: on (mode=raise)",
            "*",
            "shapeguard: 1 test traced, 4 modules and * ops checked, 0 violations, 0 warnings",
        ]
    )


def test_without_the_option_nothing_is_traced(tester):
    write_tests(tester, PASSING + SWALLOWED)
    result = tester.runpytest()
    result.assert_outcomes(passed=2)
    result.stdout.no_fnmatch_line("shapeguard:*")


def test_violation_fails_the_test_with_the_message(tester):
    write_tests(tester, "def test_raised():\n    KNotTransposed()(*inputs())\n")
    result = tester.runpytest("--shapeguard")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E * shapeguard.ShapeError: scores = Q @ K: Q.d_k (11) != K.seq_k (7)",
            "E *  in  KNotTransposed at attention.py:34",
            "E *      scores = Q @ K / math.sqrt(self.d_k)",
            "E *  Q      [[]batch=2, heads=3, seq_q=5, d_k=11] float32",
            "E *  K      [[]batch=2, heads=3, seq_k=7, d_k=11] float32",
            "E " + HINT,
        ]
    )


def test_swallowed_violation_still_fails(tester):
    write_tests(tester, SWALLOWED)
    result = tester.runpytest("--shapeguard")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "shapeguard.ShapeError: scores = Q @ K: Q.d_k (11) != K.seq_k (7)",
            "  in  KNotTransposed at attention.py:34",
            HINT,
            "(the code under test caught this error; shapeguard fails the test anyway)",
        ]
    )
    result.stdout.fnmatch_lines(["FAILED test_attn.py::test_swallowed - Failed: shapeguard*"])


def test_ini_key_turns_it_on(tester):
    tester.makeini("[pytest]\nshapeguard = true\n")
    write_tests(tester, SWALLOWED)
    result = tester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["shapeguard: on (mode=raise)", RELATION])


def test_bad_ini_mode_is_a_usage_error(tester):
    tester.makeini("[pytest]\nshapeguard_mode = loud\n")
    write_tests(tester, PASSING)
    result = tester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*shapeguard_mode = 'loud' in the ini file is not a shapeguard mode; use one of: raise, warn"
        ]
    )


def test_mode_option_turns_it_on_and_shows_in_the_header(tester):
    write_tests(tester, PASSING)
    result = tester.runpytest("--shapeguard-mode=warn")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["shapeguard: on (mode=warn)"])


def test_shapeguard_env_off_switch_wins(tester, monkeypatch):
    monkeypatch.setenv("SHAPEGUARD", "0")
    write_tests(tester, SWALLOWED)
    result = tester.runpytest("--shapeguard")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["shapeguard: off (SHAPEGUARD=0 in the environment*"])


def test_interception_is_removed_after_a_failing_test(tester):
    write_tests(
        tester,
        """
import torch
from shapeguard._trace.current import current_session
from torch.overrides import _get_current_function_mode_stack

def test_fails():
    KNotTransposed()(*inputs())

@pytest.mark.no_shapeguard
def test_after():
    assert current_session() is None
    assert _get_current_function_mode_stack() == []
    assert not torch.nn.modules.module._global_forward_pre_hooks
    assert not torch.nn.modules.module._global_forward_hooks
""",
    )
    result = tester.runpytest("--shapeguard")
    result.assert_outcomes(failed=1, passed=1)


# -- warnings and strict ------------------------------------------------------------------
WARNS = """
def test_softmax_over_queries():
    Attention(softmax_dim=-2)(*inputs())
"""


def test_shape_warning_is_reported_not_raised_even_under_filterwarnings_error(tester):
    tester.makeini("[pytest]\nfilterwarnings = error\n")
    write_tests(
        tester,
        WARNS
        + """
def test_pytest_warns_still_sees_it():
    from shapeguard import ShapeWarning
    with pytest.warns(ShapeWarning, match="sums attn over dim -1"):
        Attention(softmax_dim=-2)(*inputs())
""",
    )
    result = tester.runpytest("--shapeguard")
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*warnings summary*",
            "*ShapeWarning: " + SOFTMAX,
            "shapeguard: 2 tests traced, * 0 violations, 2 warnings",
        ]
    )


def test_strict_fails_on_a_shape_warning(tester):
    tester.makeini("[pytest]\nfilterwarnings = error\n")
    write_tests(tester, WARNS)
    result = tester.runpytest("--shapeguard-strict")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["shapeguard: on (mode=raise, strict)", "E * shapeguard.ShapeError: " + SOFTMAX]
    )


def test_strict_fails_on_a_swallowed_shape_warning(tester):
    write_tests(
        tester,
        """
def test_swallowed_warning():
    try:
        Attention(softmax_dim=-2)(*inputs())
    except RuntimeError:
        pass
""",
    )
    assert tester.runpytest("--shapeguard").ret == pytest.ExitCode.OK
    result = tester.runpytest("--shapeguard", "--shapeguard-strict")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["shapeguard.ShapeWarning (strict): " + SOFTMAX])


# -- markers --------------------------------------------------------------------------------
MARKED = """
@pytest.mark.shapeguard
def test_marked():
    try:
        KNotTransposed()(*inputs())
    except RuntimeError:
        pass

def test_unmarked():
    try:
        KNotTransposed()(*inputs())
    except RuntimeError:
        pass
"""


def test_marker_turns_it_on_for_one_test(tester):
    write_tests(tester, MARKED)
    result = tester.runpytest()
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["FAILED test_attn.py::test_marked - Failed: shapeguard*"])
    result.stdout.fnmatch_lines(["shapeguard: 1 test traced, * 1 violation, 0 warnings"])


def test_marker_with_the_option_changes_nothing_for_the_others(tester):
    write_tests(tester, MARKED)
    result = tester.runpytest("--shapeguard")
    result.assert_outcomes(failed=2)


def test_marker_arguments_set_mode_and_strict(tester):
    write_tests(
        tester,
        """
@pytest.mark.shapeguard(mode="warn", strict=True)
def test_runs_on():
    out = Attention(softmax_dim=-2)(*inputs())
    print("ran on to", tuple(out.shape))

@pytest.mark.shapeguard(strict=True)
def test_stops_there():
    Attention(softmax_dim=-2)(*inputs())
    print("never printed")
""",
    )
    result = tester.runpytest()
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "*_ test_runs_on _*",
            "shapeguard.ShapeWarning (strict): " + SOFTMAX,
            "(mode=warn let the code run on; shapeguard fails the test at its end)",
            "*Captured stdout call*",
            "ran on to (2, 3, 5, 11)",
            "*_ test_stops_there _*",
            "E * shapeguard.ShapeError: " + SOFTMAX,
        ]
    )
    result.stdout.no_fnmatch_line("never printed")


def test_module_marker_and_the_closest_marker_wins(tester):
    write_tests(
        tester,
        "pytestmark = pytest.mark.no_shapeguard\n"
        + SWALLOWED
        + """
@pytest.mark.shapeguard
def test_opted_back_in():
    test_swallowed()
""",
    )
    result = tester.runpytest("--shapeguard")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_attn.py::test_opted_back_in - Failed: shapeguard*"])


def test_opt_out(tester):
    write_tests(tester, "@pytest.mark.no_shapeguard" + SWALLOWED)
    result = tester.runpytest("--shapeguard")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["shapeguard: 0 tests traced, *"])


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        (
            "shapeguard(strcit=True, mdoe='warn')",
            "@pytest.mark.shapeguard got unknown argument(s) 'mdoe', 'strcit'; "
            "it takes mode= and strict=",
        ),
        (
            "shapeguard('warn')",
            "@pytest.mark.shapeguard takes keyword arguments only (mode=..., strict=...); "
            "got 'warn'",
        ),
        (
            "shapeguard(mode='loud')",
            "@pytest.mark.shapeguard(mode='loud'): mode must be one of: raise, warn",
        ),
        (
            "shapeguard(strict='yes')",
            "@pytest.mark.shapeguard(strict='yes'): strict must be True or False",
        ),
        ("no_shapeguard(True)", "@pytest.mark.no_shapeguard takes no arguments"),
    ],
)
def test_bad_marker_arguments_fail_naming_them(tester, marker, message):
    write_tests(tester, f"@pytest.mark.{marker}\n" + PASSING)
    result = tester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*ERROR at setup of test_ok*", message])


# -- fixture ----------------------------------------------------------------------------
FIXTURE = """
def test_scores(shapeguard):
    Attention()(*inputs())
    assert shapeguard.shape_of("scores") == (2, 3, 5, 7)
    assert shapeguard.shape_of("V") == (2, 3, 7, 11)
"""


@pytest.mark.parametrize("option", [[], ["--shapeguard"]], ids=["plugin-off", "plugin-on"])
def test_fixture_gives_the_trace_of_the_test(tester, option):
    write_tests(tester, FIXTURE)
    tester.runpytest(*option).assert_outcomes(passed=1)


def test_fixture_in_an_opted_out_test_reports_without_failing(tester):
    write_tests(
        tester,
        """
from shapeguard import ShapeError

@pytest.mark.no_shapeguard
def test_provoked(shapeguard):
    with pytest.raises(ShapeError):
        KNotTransposed()(*inputs())
    assert [f.kind for f in shapeguard.errors] == ["matmul_inner"]
""",
    )
    tester.runpytest("--shapeguard").assert_outcomes(passed=1)


# -- report section and summary -----------------------------------------------------------
def test_report_section_has_the_violation_and_the_last_ops(tester):
    write_tests(tester, SWALLOWED)
    result = tester.runpytest("--shapeguard")
    lines = section(result.stdout.str())
    assert lines[0] == "scores = Q @ K: Q.d_k (11) != K.seq_k (7)"
    assert "  hint: K was not transposed: use Q @ K.transpose(-2, -1)" in lines
    start = lines.index("last 10 of 23 ops before it:")
    rows = []
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    # index, op, module, location, label, named shape: the ten ops before Q @ K.
    assert [row[:2] for row in rows] == [
        ["13", "randn"],
        ["14", "linear"],
        ["15", "view"],
        ["16", "transpose"],
        ["17", "linear"],
        ["18", "view"],
        ["19", "transpose"],
        ["20", "linear"],
        ["21", "view"],
        ["22", "transpose"],
    ]
    assert rows[1] == [
        "14",
        "linear",
        "W_q (Linear)",
        "attention.py:20",
        "Q",
        "[batch=2, seq_q=5, d_model=33]",
    ]
    assert rows[-1] == [
        "22",
        "transpose",
        "KNotTransposed",
        "attention.py:22",
        "V",
        "[batch=2, heads=3, seq_k=7, d_k=11]",
    ]


def test_summary_line_sums_the_tests(tester):
    counts = """
def test_{name}(shapeguard):
    {body}
    print("counted", shapeguard.modules_seen, len(shapeguard.events))
"""
    write_tests(
        tester,
        counts.format(name="full", body="Attention()(*inputs())")
        + counts.format(name="one_op", body="torch.softmax(torch.randn(2, 3, 5, 7), dim=-1)")
        + "import torch\n",
    )
    result = tester.runpytest("--shapeguard", "-s")
    result.assert_outcomes(passed=2)
    counted = re.findall(r"counted (\d+) (\d+)", result.stdout.str())
    assert counted == [("4", "28"), ("0", "2")]
    result.stdout.fnmatch_lines(
        ["shapeguard: 2 tests traced, 4 modules and 30 ops checked, 0 violations, 0 warnings"]
    )


# -- disabling, xdist, imports ---------------------------------------------------------------
def test_p_no_shapeguard_disables_the_plugin(tester):
    write_tests(tester, MARKED)
    result = tester.runpytest("-p", "no:shapeguard")
    result.assert_outcomes(passed=2)
    result.stdout.no_fnmatch_line("shapeguard:*")
    result = tester.runpytest("-p", "no:shapeguard", "--shapeguard")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unrecognized arguments: --shapeguard*"])


def test_xdist_workers_send_their_counts_to_the_controller(tester):
    write_tests(tester, PASSING + SWALLOWED, name="test_one")
    write_tests(tester, FIXTURE + WARNS, name="test_two")
    alone = tester.runpytest("--shapeguard")
    alone.assert_outcomes(passed=3, failed=1)
    summary = [line for line in alone.outlines if line.startswith("shapeguard: 4 tests traced")]
    assert len(summary) == 1 and summary[0].endswith("1 violation, 1 warning")
    spread = tester.runpytest_subprocess("-n", "2", "--shapeguard")
    spread.assert_outcomes(passed=3, failed=1)
    spread.stdout.fnmatch_lines(["shapeguard: on (mode=raise)", "*2 workers*", summary[0]])
    spread.stdout.fnmatch_lines(["FAILED test_one.py::test_swallowed*"])


PROBE = """
import sys

def test_probe(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("shapeguard")
    print("torch imported:", "torch" in sys.modules)
"""


def test_loading_the_plugin_imports_no_torch(pytester):
    pytester.makepyfile(test_probe=PROBE)
    result = pytester.runpytest_subprocess("-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*torch imported: False*"])


def test_the_no_torch_check_can_fail(pytester):
    # The same probe sees torch when the plugin is on, so the test above is not vacuous.
    pytester.makepyfile(test_probe=PROBE)
    result = pytester.runpytest_subprocess("-s", "--shapeguard")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*torch imported: True*"])


def test_report_section_and_summary_match_their_golden_file(tester):
    """The whole section a failing test gets, and the run's summary line, byte for byte
    (SHAPEGUARD_REGEN=1 rewrites tests/golden/pytest_section.txt)."""
    from _golden import check_golden

    write_tests(tester, SWALLOWED)
    result = tester.runpytest("--shapeguard")
    out = result.stdout.str()
    summary = [line for line in out.splitlines() if line.startswith("shapeguard: ")]
    check_golden("pytest_section.txt", "\n".join([*section(out), "", *summary]) + "\n")
