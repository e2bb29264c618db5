"""The domain bug zoo (issue 32, tests/domain_zoo.py): the correct counterparts give no finding
at the three sizes and no failed probe; each bug's present outcome is pinned (`Bug.expect`), so
an engine fix or a regression shows up here as a changed pin. bench/domain_zoo.py measures the
same and prints the table per domain.

The trace pins hold at all three sizes; the check pins (a bug the trace misses) are asserted at
the distinct and coincident sizes, where check is fast; the bench measures them at the realistic
size too."""

import functools
import re

import domain_zoo
import domain_zoo_measure as measuring
import pytest

# The zoo's bugs raise and warn on purpose; the trace under test is each test's own.
pytestmark = pytest.mark.no_shapeguard

SIZES = {s.name: s for s in domain_zoo.SETTINGS}
CHECKED = ("distinct", "coincident")
# Axis names as the engine writes them in a relation, e.g. "[heads=4, seq_q=11, d_k=16]" or
# "softmax over seq_q (dim -2)".
AXIS = re.compile(
    r"\b(batch|heads|seq|seq_q|seq_k|d_k|d_model|channels|height|width|height\*width|"
    r"embed_dim|key|query|keys|queries)\b"
)


def _correct_cases():
    return [pytest.param(a, s, id=f"{a}-{s}") for a in domain_zoo.ARCHS for s in SIZES]


def _bug_cases(sizes, missed_by_the_trace=False):
    return [
        pytest.param(b, s, id=f"{b.name}-{s}")
        for b in domain_zoo.BUGS
        for s in sizes
        if not missed_by_the_trace or b.expected(SIZES[s]) != "trace"
    ]


@pytest.mark.parametrize(("arch", "size"), _correct_cases())
def test_a_correct_counterpart_traces_without_a_finding(arch, size):
    traced = measuring.run_trace(*measuring.build(domain_zoo.ARCHS[arch], SIZES[size], None))
    assert traced["error"] is None, traced["error"]
    found = sorted({f"trace: {h['kind']}" for h in traced["findings"]})
    assert found == domain_zoo.false_alarms(arch, size, "trace"), [
        h["message"] for h in traced["findings"]
    ]


@functools.cache
def _correct_checked(arch: str, size: str) -> dict:
    """check's probes on a correct counterpart: the same measurement (the module and the probes
    are seeded) for that test and for every bug of the arch at the size, so made once per
    process. Read only."""
    return measuring.run_check(*measuring.build(domain_zoo.ARCHS[arch], SIZES[size], None))


@pytest.mark.parametrize("arch", list(domain_zoo.ARCHS))
def test_check_fails_no_probe_on_a_correct_counterpart(arch):
    checked = _correct_checked(arch, "distinct")
    failed = sorted(f"check: {name}" for name in checked["failed"])
    assert failed == domain_zoo.false_alarms(arch, "distinct", "check")


@pytest.mark.parametrize(("bug", "size"), _bug_cases(SIZES))
def test_what_the_trace_finds_of_a_bug_is_pinned(bug, size):
    traced = measuring.run_trace(
        *measuring.build(domain_zoo.ARCHS[bug.arch], SIZES[size], bug.name)
    )
    about = measuring.about(bug, traced)
    expected = bug.expected(SIZES[size])
    if expected != "trace":
        assert not about, f"{bug.name} at {size} is found now: update its pin ({about})"
        return
    assert about, f"{bug.name} at {size}: no finding on its lines ({measuring.hits(traced)})"
    kinds = bug.kind.split("|")  # the kinds it is found as (which one can depend on the size)
    pinned = [h for h in about if h["kind"] in kinds]
    assert pinned, about
    if pinned[0]["kind"] != "torch_error":  # torch's own text, passed through with the line
        # The relation or the operands' shapes name an axis ("[batch=3, seq=5, ...]").
        assert AXIS.search(pinned[0]["message"]), pinned[0]["message"]


@pytest.mark.parametrize(("bug", "size"), _bug_cases(CHECKED, missed_by_the_trace=True))
def test_what_check_finds_of_a_bug_the_trace_misses_is_pinned(bug, size):
    expected = bug.expected(SIZES[size])
    arch = domain_zoo.ARCHS[bug.arch]
    correct = _correct_checked(bug.arch, size)
    checked = measuring.run_check(*measuring.build(arch, SIZES[size], bug.name))
    new = sorted(set(checked["failed"]) - set(correct["failed"]))
    assert bool(new) == (expected == "check"), (bug.name, size, new)


def test_the_zoo_has_what_issue_32_asks_for():
    """At least 40 bugs, at least 3 per domain, about 5 for vision and diffusion; each with a
    source, a manifestation, marked lines and a pin for every size."""
    assert len(domain_zoo.BUGS) >= 40
    per_domain = {d: [b for b in domain_zoo.BUGS if b.domain == d] for d in domain_zoo.DOMAINS}
    assert all(len(bugs) >= 3 for bugs in per_domain.values()), per_domain
    assert len(per_domain["vision"]) >= 5 and len(per_domain["diffusion"]) >= 5
    assert len({b.name for b in domain_zoo.BUGS}) == len(domain_zoo.BUGS)
    for bug in domain_zoo.BUGS:
        assert bug.source.startswith(("report: ", "injected: ")), bug.name
        assert bug.manifests and domain_zoo.marked_lines(bug), bug.name
        assert {bug.expected(s) for s in domain_zoo.SETTINGS} <= {"trace", "check", "miss"}
        assert (bug.kind != "") == ("trace" in {bug.expected(s) for s in domain_zoo.SETTINGS})


def test_a_finding_counts_only_on_the_bugs_own_lines():
    """The measurement's rule: a finding elsewhere in a buggy module is not a find."""
    bug = next(b for b in domain_zoo.BUGS if b.name == "vit_merge")
    line = min(domain_zoo.marked_lines(bug))
    source = domain_zoo.ARCHS[bug.arch].source_file
    assert domain_zoo.about_the_bug(bug, f"{source}:{line}")
    assert not domain_zoo.about_the_bug(bug, f"{source}:{line + 1}")
    assert not domain_zoo.about_the_bug(bug, f"elsewhere.py:{line}")
