"""One reporting path (`_reporting.deliver`): what a mode, strict, a suppression comment
and a repeated warning do is the same for rules, contracts and flash-attn's contract."""

import warnings

import pytest

from shapeguard import ShapeError, ShapeWarning, Trace
from shapeguard._reporting import deliver

pytestmark = pytest.mark.no_shapeguard  # warnings on purpose


def _error(location: str = "model.py:3") -> ShapeError:
    return ShapeError(
        "softmax over heads=8, not seq_k=64",
        kind="softmax_axis",
        op="softmax",
        location=location,
        source="w = scores.softmax(dim=1)",
        hint="softmax(dim=-1)",
    )


def test_an_error_in_raise_mode_is_recorded_then_raised():
    trace = Trace(mode="raise")
    with pytest.raises(ShapeError, match="softmax over heads=8"):
        deliver(_error(), "error", mode="raise", trace=trace)
    assert [f.kind for f in trace.findings] == ["softmax_axis"]
    assert trace.findings[0].severity == "error"


def test_a_warning_is_warned_once_per_kind_and_line_and_recorded_each_time():
    trace, once = Trace(mode="warn"), set()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert deliver(_error(), "warning", mode="warn", trace=trace, once=once) is None
    assert len(caught) == 1 and issubclass(caught[0].category, ShapeWarning)
    assert "softmax over heads=8" in str(caught[0].message)
    assert "hint: softmax(dim=-1)" in str(caught[0].message)
    assert len(trace.findings) == 3


def test_an_error_in_warn_mode_is_warned_and_returned_for_torch_failing_next():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = deliver(_error(), "error", mode="warn")
    assert found is not None and found.kind == "softmax_axis"
    assert "softmax over heads=8" in str(caught[0].message)


def test_strict_raises_a_warning():
    with pytest.raises(ShapeError, match="softmax over heads=8"):
        deliver(_error(), "warning", mode="raise", strict=True)


def test_a_kind_silenced_on_its_line_is_listed_and_goes_no_further(tmp_path):
    source = tmp_path / "model.py"
    source.write_text("x = 1\nw = scores.softmax(dim=1)  # shapeguard: ignore[softmax_axis]\n")
    trace = Trace(mode="raise")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert deliver(_error(f"{source}:2"), "error", mode="raise", trace=trace) is None
    assert not caught and not trace.findings
    assert [f.kind for f in trace.suppressed] == ["softmax_axis"]
    # Another kind on that line is not silenced.
    other = ShapeError(
        "mask [4, 64] does not broadcast", kind="mask_broadcast", location=f"{source}:2"
    )
    with pytest.raises(ShapeError, match="does not broadcast"):
        deliver(other, "error", mode="raise", trace=trace)
