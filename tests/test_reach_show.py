"""The reach shown: the description a site's table line gives, the character matrix of
`trace --reach`, the HTML's SVG matrices and the JSON's `reach` list, from Reach objects
made of known visibility (the sites that record them are tests/test_reach_sites.py's)."""

import dataclasses
import json
import re

import pytest
import torch

import shapeguard
from shapeguard._errors import Finding
from shapeguard._reach.as_json import JSON_MAX_ROWS, JSON_MAX_RUNS
from shapeguard._reach.describe import describe, pattern
from shapeguard._reach.rows import Reach
from shapeguard.report._reach_text import LEGEND, NoSuchSite, render_reach, table_lines
from shapeguard.report._reach_view import MAX_PICTURES, pictures
from shapeguard.report.html import render_fragment, render_html

# (batch, heads, seq): pairwise distinct, coincident, realistic.
SIZES = [(3, 4, 7), (4, 4, 4), (4, 8, 64)]
IDS = ["distinct", "coincident", "realistic"]


def causal(seq_q: int, seq_k: int | None = None) -> torch.Tensor:
    """Query i sees keys 0..i + (seq_k - seq_q): the cache's keys and its own."""
    seq_k = seq_q if seq_k is None else seq_k
    return torch.ones(seq_q, seq_k, dtype=torch.bool).tril(seq_k - seq_q)


def window(seq: int, width: int) -> torch.Tensor:
    i = torch.arange(seq)
    return causal(seq) & (i[:, None] - i[None, :] < width)


def documents(lengths: list[int]) -> torch.Tensor:
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return doc[:, None] == doc[None, :]


def reach(visible: torch.Tensor, batch: int, heads: int, **where) -> Reach:
    where = {
        "op": "softmax",
        "module": "blocks.0.attn",
        "location": "/src/model.py:48",
        "lead_axes": ("batch", "heads"),
        "event": 14,
        **where,
    }
    return Reach.from_visible(visible, lead=(batch, heads), **where)


def padded(visible: torch.Tensor, batch: int, example: int, keys: slice) -> torch.Tensor:
    """`visible` for every example, with `keys` hidden from every query of `example`."""
    out = visible.expand(batch, 1, *visible.shape).clone()
    out[example, :, :, keys] = False
    return out


# -- the description ---------------------------------------------------------------------------
@pytest.mark.parametrize(("batch", "heads", "seq"), SIZES, ids=IDS)
def test_each_pattern_is_named(batch, heads, seq):
    assert describe(reach(torch.ones(seq, seq + 2, dtype=torch.bool), batch, heads)) == "all keys"
    assert describe(reach(causal(seq), batch, heads)) == "causal"
    assert describe(reach(causal(seq - 2, seq), batch, heads)) == "causal, 2 cached keys"
    assert describe(reach(window(seq, 3), batch, heads)) == "window 3"
    lengths = [1, 2, seq - 3]
    assert describe(reach(documents(lengths), batch, heads)) == "documents 3"
    assert describe(reach(documents(lengths) & causal(seq), batch, heads)) == "documents 3, causal"


@pytest.mark.parametrize(("batch", "heads", "seq"), SIZES, ids=IDS)
def test_padding_is_said_with_its_example(batch, heads, seq):
    right = padded(causal(seq), batch, 1, slice(seq - 2, None))
    assert describe(reach(right, batch, heads)) == (
        f"causal + padding: keys {seq - 2}..{seq - 1} in example 1"
    )
    # Left padding as transformers makes it: the padded queries' rows are unmasked (all keys).
    left = padded(causal(seq), batch, 1, slice(0, 2))
    left[1, :, :2, :] = True
    assert describe(reach(left, batch, heads)) == "causal + padding: keys 0..1 in example 1"
    bidirectional = padded(torch.ones(seq, seq, dtype=torch.bool), batch, 2, slice(seq - 1, None))
    assert describe(reach(bidirectional, batch, heads)) == (
        f"all keys + padding: key {seq - 1} in example 2"
    )
    # An inverted triangle (tril and triu swapped): query 0 sees every key and no other
    # query sees key 0, as with one unmasked padded query, but the real rows look ahead:
    # no padding is said.
    inverted = torch.ones(seq, seq, dtype=torch.bool).triu()
    assert describe(reach(inverted[None, None], batch, heads)) == (
        f"query {seq - 1} sees key {seq - 1} (1 of {seq})"
    )


@pytest.mark.parametrize(("batch", "heads", "seq"), SIZES, ids=IDS)
def test_the_intents_padding_is_the_one_said(batch, heads, seq):
    """`reach.padding` (filled by `invariants.judge`) is used as it is, per example, even
    where the rows are alike across examples."""
    site = reach(causal(seq), batch, heads)
    site = dataclasses.replace(site, padding=((), ((0, 1),), ()))
    assert describe(site) == "causal + padding: key 0 in example 1"  # seen: marks flag it
    hidden = padded(causal(seq), batch, 1, slice(0, 2))
    hidden[1, :, :2, :] = True  # the padded query's row unmasked, as transformers does
    site = dataclasses.replace(reach(hidden, batch, heads), padding=((), ((0, 2),)))
    assert describe(site) == "causal + padding: keys 0..1 in example 1"
    # The padding mask put on the query axis: the padded queries see nothing, the real
    # ones every key up to their own, padding included (the intent's marks flag those).
    on_queries = causal(seq).expand(batch, 1, seq, seq).clone()
    on_queries[1, :, :2, :] = False
    site = dataclasses.replace(reach(on_queries, batch, heads), padding=((), ((0, 2),)))
    assert describe(site) == "causal + padding: keys 0..1 in example 1"


@pytest.mark.parametrize(("batch", "heads", "seq"), SIZES, ids=IDS)
def test_heads_or_examples_that_differ_are_said_apart(batch, heads, seq):
    by_head = torch.stack([causal(seq) if h % 2 == 0 else window(seq, 3) for h in range(heads)])
    evens = ", ".join(str(h) for h in range(0, heads, 2))
    odds = ", ".join(str(h) for h in range(1, heads, 2))
    assert describe(reach(by_head, batch, heads)) == (
        f"causal in heads {evens}; window 3 in heads {odds}"
    )
    by_example = torch.stack([window(seq, 3) if b == 1 else causal(seq) for b in range(batch)])
    others = f"0, 2..{batch - 1}" if batch > 3 else "0, 2"
    assert describe(reach(by_example.unsqueeze(1), batch, heads)) == (
        f"causal in examples {others}; window 3 in example 1"
    )


@pytest.mark.parametrize(("batch", "heads", "seq"), SIZES, ids=IDS)
def test_rows_of_no_pattern_give_the_last_querys_row(batch, heads, seq):
    visible = causal(seq)
    visible[seq - 1, 1] = False
    assert describe(reach(visible, batch, heads)) == (
        f"query {seq - 1} sees keys 0, 2..{seq - 1} ({seq - 1} of {seq})"
    )


def test_a_sampled_site_says_so_and_derives_no_padding():
    visible = causal(600)
    visible[:, 590:] = False
    assert describe(reach(visible, 1, 1)) == (
        "query 599 sees keys 0..589 (590 of 600) (from 512 of 600 queries, sampled)"
    )
    assert describe(reach(causal(600), 2, 3)) == "causal (from 512 of 600 queries, sampled)"


def test_a_site_without_queries_is_said_and_not_drawn():
    site = Reach.from_visible(torch.ones(0, 5, dtype=torch.bool), op="softmax")
    assert describe(site) == "no cell (0 queries, 5 keys)"
    assert render_reach(traced(site)) == (
        f"softmax in (top level) [seq_q=0, seq_k=5], read from: mask\n  no cell (0 queries, 5 keys)\n\n{LEGEND}\n"
    )
    assert '<svg class="reach"' not in render_html(traced(site))


def test_pattern_reads_runs_of_any_origin():
    rows = [(0, ((0, 1),)), (1, ((0, 2),)), (2, ((1, 3),)), (3, ((2, 4),))]
    assert pattern(rows, 4, 4) == "window 2"
    assert pattern(rows[:2], 2, 4) == "causal from key 0 (top-left)"
    assert pattern([(0, ((1, 3),)), (1, ((2, 4),))], 2, 4) == "window 2, 2 cached keys"
    assert pattern([(0, ()), (1, ())], 2, 2) is None


# -- the table's line -------------------------------------------------------------------------
def traced(*sites: Reach, findings=()) -> shapeguard.Trace:
    trace = shapeguard.Trace()
    trace.reach.extend(sites)
    trace.findings.extend(findings)
    return trace


def two_layers(seq: int = 9, batch: int = 3, heads: int = 4) -> list[Reach]:
    visible = padded(causal(seq), batch, 1, slice(seq - 2, None))
    return [
        reach(visible, batch, heads, module=f"blocks.{n}.attn", event=14 + 16 * n) for n in (0, 1)
    ]


def test_the_table_has_one_line_per_site_within_its_width():
    trace = traced(*two_layers())
    line = (
        "reach #14 softmax in blocks.0.attn (model.py:48): causal + padding: keys 7..8 in example 1"
    )
    for width in (80, 150):
        text = trace.table(width=width)
        assert all(len(row) <= width for row in text.splitlines()), text
        assert "reach #30 softmax in blocks.1.attn" in text
    assert line in trace.table(width=150).splitlines()


def test_folding_counts_sites_that_repeat_an_earlier_layer_unless_they_have_a_finding():
    first, second = two_layers()
    assert table_lines(traced(first, second), fold=True) == [
        "reach #14 softmax in blocks.0.attn (model.py:48): causal + padding: keys 7..8 in example 1",
        "1 reach site not shown: it repeats a site above in another layer (--no-fold shows them)",
    ]
    flagged = Finding(
        "reach_padded_key", "warning", "a real query sees a padded key", event_index=30
    )
    lines = table_lines(traced(first, second, findings=[flagged]), fold=True)
    assert [line.split(":")[0] for line in lines] == [
        "reach #14 softmax in blocks.0.attn (model.py",
        "reach #30 softmax in blocks.1.attn (model.py",
    ]


# -- the matrix ---------------------------------------------------------------------------------
def test_the_matrix_draws_each_distinct_example_with_padding_and_flags():
    site = reach(padded(causal(5), 2, 1, slice(4, None)), 2, 3)
    site = dataclasses.replace(site, marks=(((1, 0), 2, ((3, 5),)),))
    flagged = Finding("reach_padded_key", "warning", "query 2 sees key 4 (padding)", event_index=14)
    assert render_reach(traced(site, findings=[flagged])) == (
        "#14 softmax in blocks.0.attn (model.py:48) [batch=2, heads=3, seq_q=5, seq_k=5], "
        "read from: mask\n"
        "  causal + padding: key 4 in example 1\n"
        "  warning reach_padded_key: query 2 sees key 4 (padding)\n"
        "  example 0, every head:\n"
        "        01234\n"
        "    q 0 #....\n"
        "    q 1 ##...\n"
        "    q 2 ###..\n"
        "    q 3 ####.\n"
        "    q 4 #####\n"
        "  example 1, every head:\n"
        "        01234\n"
        "    q 0 #...p\n"
        "    q 1 ##..p\n"
        "    q 2 ###!!\n"
        "    q 3 ####p\n"
        "    q 4 ####p\n"
        "\n"
        f"{LEGEND}\n"
    )


def test_pictures_are_labelled_with_the_examples_and_heads_they_stand_for():
    by_head = torch.stack([causal(7) if h % 2 == 0 else window(7, 3) for h in range(4)])
    drawn, more = pictures(reach(by_head, 3, 4))
    assert [p.label for p in drawn] == ["every example, heads 0, 2", "every example, heads 1, 3"]
    assert more == 0
    checkered = torch.stack(
        [
            torch.stack([causal(7) if (h + b) % 2 == 0 else window(7, 3) for h in range(4)])
            for b in range(3)
        ]
    )
    drawn, _ = pictures(reach(checkered, 3, 4))
    assert [p.label for p in drawn] == [
        "slices [0, 0], [0, 2], [1, 1], [1, 3] and 2 more",
        "slices [0, 1], [0, 3], [1, 0], [1, 2] and 2 more",
    ]
    distinct = torch.stack([window(7, w) for w in range(1, 8)])  # 7 heads, 7 pictures
    drawn, more = pictures(reach(distinct, 1, 7))
    assert len(drawn) == MAX_PICTURES and more == 7 - MAX_PICTURES


def test_long_sites_are_sampled_and_share_columns_and_say_so():
    text = render_reach(traced(reach(causal(700), 1, 1, module="big")))
    lines = text.splitlines()
    assert "  all queries:" in lines
    assert "    48 of 700 queries drawn (sampled; the trace kept 512)" in lines
    assert "    keys 0..699, 8 to a column (+ some of them seen)" in lines
    rows = [line for line in lines if re.match(r"\s+q \d+ ", line)]
    assert len(rows) == 48 and rows[0].split()[1] == "0" and rows[-1].split()[1] == "699"
    assert rows[-1].endswith("#" * 88)


def test_layer_picks_sites_by_path_glob_or_substring_and_lists_them_when_none_matches():
    trace = traced(*two_layers())
    assert render_reach(trace, "blocks.1.attn").startswith("#30 softmax in blocks.1.attn")
    assert render_reach(trace, "blocks.*.attn").count("read from: mask") == 2
    assert render_reach(trace, "1.att").startswith("#30 ")
    with pytest.raises(NoSuchSite) as raised:
        render_reach(trace, "decoder")
    assert str(raised.value) == (
        "--reach 'decoder' matches no attention site; the sites: blocks.0.attn, blocks.1.attn"
    )
    assert render_reach(traced()) == "no attention site's reach was recorded\n"


# -- HTML -----------------------------------------------------------------------------------------
def test_the_html_draws_each_site_with_padding_flags_and_its_findings():
    first, second = two_layers()
    second = dataclasses.replace(second, marks=(((1, 0), 3, ((7, 9),)),))
    flagged = Finding("reach_padded_key", "warning", "query 3 sees keys 7..8", event_index=30)
    page = render_html(traced(first, second, findings=[flagged]))
    section = re.search(r'<section id="reach">(.*?)</section>', page, re.S).group(1)
    sites = re.findall(r'<div class="reach-site" id="reach-(\d)" data-event="(\d+)">', section)
    assert sites == [("0", "14"), ("1", "30")]
    assert section.count('<svg class="reach"') == 4  # examples 0 and 2 alike, example 1 apart
    assert section.count('class="pad"') == 2  # example 1's keys 7..8, in each site
    assert section.count('class="flag"') == 1
    assert '<a href="#finding-1">#1</a> <code>reach_padded_key</code>' in section
    assert "causal + padding: keys 7..8 in example 1" in section
    assert "examples 0, 2, every head" in section and "http" not in section
    assert '<a href="#reach">Attention reach</a>' in page
    drawn = section.split("</h2>", 1)[1]
    assert drawn in render_fragment(traced(first, second, findings=[flagged]))


def test_a_notebook_shows_the_reach_of_a_real_trace():
    from reach_pictures import left_padded_trace

    shown = left_padded_trace()._repr_html_()
    assert shown.startswith('<div class="shapeguard">')
    assert "causal + padding: keys 0..1 in example 1" in shown
    assert shown.count('<svg class="reach"') == 2 and shown.count('class="pad"') == 1


def test_the_html_samples_long_sites_visibly_and_leaves_out_the_section_without_reach():
    page = render_html(traced(reach(causal(700), 1, 1)))
    assert "64 of 700 queries drawn (sampled; the trace kept 512)" in page
    assert page.count('class="seen"') == 64
    assert 'id="reach"' not in render_html(traced())
    torch.manual_seed(0)
    site = reach(torch.rand(8, 3000) > 0.5, 1, 1)  # ~750 runs a row, 3000 keys in 360 px
    runs = sum(len(site.row((0, 0), q)) for q in range(8))
    drawn = render_html(traced(site)).count('class="seen"')
    assert runs > 8 * 360 and 0 < drawn <= 8 * 360 // 2  # a gap of a pixel between rects


# -- JSON -------------------------------------------------------------------------------------------
def test_the_json_reach_list_holds_the_site_and_its_rows_as_runs():
    site = reach(padded(causal(4), 2, 1, slice(3, None)), 2, 3)
    (found,) = json.loads(traced(site).to_json())["reach"]
    assert found == {
        "site": "blocks.0.attn",
        "event": 14,
        "op": "softmax",
        "location": "/src/model.py:48",
        "how": "mask",
        "lead": [2, 3],
        "lead_axes": ["batch", "heads"],
        "stored": [2, 1],
        "seq_q": 4,
        "seq_k": 4,
        "summary": "causal + padding: key 3 in example 1",
        "count": 1,
        "queries": None,
        "patterns": [[[0, 1]], [[0, 2]], [[0, 3]], [[0, 4]]],
        "rows": [
            {"index": [0, 0], "pattern": [0, 1, 2, 3]},
            {"index": [1, 0], "pattern": [0, 1, 2, 2]},
        ],
        "slices_omitted": 0,
        "padding": [],
        "marks": [],
    }


def test_the_json_rows_are_bounded():
    triangles = torch.stack([torch.ones(64, 64, dtype=torch.bool).tril(k) for k in range(-50, 50)])
    site = Reach.from_visible(triangles, lead=(100,), op="softmax")
    (found,) = traced(site).to_dict()["reach"]
    assert len(found["rows"]) == JSON_MAX_ROWS // 64 and found["slices_omitted"] == 100 - 64
    used = {p for r in found["rows"] for p in r["pattern"]}
    assert used == set(range(len(found["patterns"])))


def test_the_json_runs_are_bounded_for_scattered_masks():
    torch.manual_seed(0)
    site = Reach.from_visible(torch.rand(40, 64, 64) > 0.5, lead=(40,), op="softmax")
    (found,) = traced(site).to_dict()["reach"]
    runs = sum(len(pattern) for pattern in found["patterns"])
    assert runs <= JSON_MAX_RUNS < runs + 64 * 64
    assert found["slices_omitted"] == 40 - len(found["rows"]) > 0
    said = r"query 63 sees keys [^;]*, \.\.\. \(\d+ runs\) \(\d+ of 64\) in example \d"
    assert re.fullmatch(f"{said}; {said}; {said}; and 37 more groups of examples", found["summary"])
