"""A trace with a reach to draw, and a page of its reach section alone: for the browser test
(tests/test_report_html.py) and for docs/reach.png (`python tests/reach_pictures.py OUT.html`)."""

import dataclasses
import sys

import torch

import shapeguard
from shapeguard._reach.rows import Reach
from shapeguard.report._html_reach import reach_section
from shapeguard.report.html import CSS

BATCH, HEADS, SEQ = 3, 4, 9


def left_padded_trace() -> shapeguard.Trace:
    """A causal site whose example 1 has two padded keys on the left (their queries' rows
    unmasked, as transformers does), one row flagged."""
    visible = torch.ones(SEQ, SEQ, dtype=torch.bool).tril().expand(BATCH, 1, SEQ, SEQ).clone()
    visible[1, :, :, :2] = False
    visible[1, :, :2, :] = True
    site = Reach.from_visible(
        visible,
        lead=(BATCH, HEADS),
        op="softmax",
        module="layers.0.self_attn",
        location="model.py:48",
        lead_axes=("batch", "heads"),
        event=0,
    )
    site = dataclasses.replace(site, marks=(((1, 0), 5, ((0, 2),)),))
    trace = shapeguard.Trace()
    trace.reach.append(site)
    return trace


def reach_page(trace) -> str:
    """The reach section of `trace` as a page of its own, with the report's styles."""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>reach</title>'
        f"<style>{CSS}</style></head><body><main>{reach_section(trace)}</main></body></html>"
    )


if __name__ == "__main__":
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        out.write(reach_page(left_padded_trace()))
