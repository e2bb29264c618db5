"""The HTML report: content from the trace, findings on the diagram and the source,
attention capture, memory figures, and a real headless Chromium that loads the page.
"""

import json
import os
import pathlib
import re
import shutil
import struct
import subprocess
import warnings
import zlib

import pytest
import torch
import torch.nn.functional as F
from attention_models import DK, SK, SQ, B, H, HandAttention
from attention_models import CrossAttention as SDPACrossAttention

import shapeguard
from shapeguard.report import _flow, _png
from shapeguard.report.html import capture_attention, render_html

# These tests provoke shape violations on purpose and assert on them.
pytestmark = pytest.mark.no_shapeguard

ROOT = pathlib.Path(__file__).resolve().parent.parent
D = H * DK
CHROMIUM = "/usr/bin/chromium"
# Where the browser test leaves its screenshot (build/ is ignored by git).
ARTIFACTS = pathlib.Path(os.environ.get("SHAPEGUARD_ARTIFACTS", ROOT / "build" / "test-artifacts"))


class CrossAttention(torch.nn.Module):
    """Hand-written cross-attention: every stage is its own op, seq_q != seq_k."""

    def __init__(self, d_model=D, n_heads=H):
        super().__init__()
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.W_q = torch.nn.Linear(d_model, d_model)
        self.W_k = torch.nn.Linear(d_model, d_model)
        self.W_v = torch.nn.Linear(d_model, d_model)
        self.out = torch.nn.Linear(d_model, d_model)

    def forward(self, x, memory):
        b, t_q, _ = x.shape
        t_k = memory.size(1)
        Q = self.W_q(x).view(b, t_q, self.n_heads, self.d_k).transpose(1, 2)
        K = self.W_k(memory).view(b, t_k, self.n_heads, self.d_k).transpose(1, 2)
        V = self.W_v(memory).view(b, t_k, self.n_heads, self.d_k).transpose(1, 2)
        scores = Q @ K.transpose(-2, -1) / self.d_k**0.5
        attn = F.softmax(scores, dim=-1)
        context = (attn @ V).transpose(1, 2).reshape(b, t_q, self.d_model)
        return self.out(context)


def cross_inputs():
    torch.manual_seed(0)
    return torch.randn(B, SQ, D), torch.randn(B, SK, D)


@pytest.fixture(scope="module")
def cross_trace():
    return shapeguard.trace(CrossAttention(), *cross_inputs())


def failing_trace(bug: str, *inputs) -> shapeguard.Trace:
    """The trace of a forward that raised, as `shapeguard trace --html` keeps it."""
    trace = shapeguard.Trace()
    with pytest.raises(shapeguard.ShapeError), trace:
        HandAttention(bug=bug)(*inputs)
    return trace


# -- content ---------------------------------------------------------------------------
def test_flow_has_every_stage_with_named_shapes(cross_trace):
    page = render_html(cross_trace)
    (block,) = _flow.build_blocks(cross_trace)
    stages = [(n.stage, n.column) for n in block.nodes]
    for stage in [
        ("proj", "Q"),
        ("proj", "K"),
        ("proj", "V"),
        ("split", "Q"),
        ("split", "K"),
        ("split", "V"),
        ("scores", ""),
        ("softmax", ""),
        ("context", ""),
        ("merge", ""),
        ("out", ""),
    ]:
        assert stage in stages
    assert [n.column for n in block.nodes if n.stage == "input"] == ["x", "memory"]
    # Each tensor's shape with its axis names, seq_q and seq_k apart.
    assert f"[batch={B}, heads={H}, seq_q={SQ}, seq_k={SK}]" in page
    assert f"[batch={B}, heads={H}, seq_k={SK}, d_k={DK}]" in page
    assert "head split K" in page and "context = attn V" in page


def test_page_is_self_contained(cross_trace):
    page = render_html(cross_trace, capture_attention(CrossAttention(), *cross_inputs()))
    assert page.startswith("<!DOCTYPE html>")
    for needle in ("http://", "https://", "<link", "<script src", 'src="//', "@import"):
        assert needle not in page, needle
    # url(...) only for the arrowheads defined in the page itself.
    assert re.findall(r"url\((?!#b\d+-arrow\))", page) == []


def test_loud_bug_is_a_failed_box_at_its_stage_and_a_marked_source_line():
    trace = failing_trace("k_not_transposed", torch.randn(B, SQ, D))
    page = render_html(trace)
    (block,) = _flow.build_blocks(trace)
    failed = [n for n in block.nodes if n.failed_op]
    assert [(n.stage, n.failed_op, n.findings) for n in failed] == [("scores", "matmul", [0])]
    assert '<g class="node scores error failed">' in page
    finding = trace.findings[0]
    assert finding.kind == "matmul_inner"
    assert 'class="traced error"' in page  # the source line of the matmul
    assert page.count('href="#finding-1"') >= 3  # badge, source note, box link
    assert f"Q.d_k ({DK}) != K.seq ({SQ})" in page


def test_silent_bug_warning_lands_on_the_box_of_the_op_that_made_it():
    trace = shapeguard.Trace(mode="warn")
    with warnings.catch_warnings(record=True), trace:
        warnings.simplefilter("always")
        HandAttention(bug="softmax_axis")(torch.randn(B, SQ, D))
    (block,) = _flow.build_blocks(trace)
    (softmax,) = [n for n in block.nodes if n.stage == "softmax"]
    assert [trace.findings[i].kind for i in softmax.findings] == ["softmax_axis"]
    assert '<g class="node softmax warning">' in render_html(trace)


def test_memory_names_the_score_peak_and_what_flash_would_keep(cross_trace):
    page = render_html(cross_trace)
    scores = B * H * SQ * SK * 4
    assert f"<b>{scores} B</b>" in page  # the largest [B, H, seq_q, seq_k] tensor
    assert f"= {B * H * SQ * 4} B)" in page  # flash-attn's one float32 per query row
    assert "grows with seq²" in page
    # The scaling table goes past the traced length.
    assert '<td class="num">2,048</td>' in page


def test_fused_attention_is_one_box_and_its_scores_are_what_sdpa_would_need():
    trace = shapeguard.trace(SDPACrossAttention(), *cross_inputs())
    (block,) = _flow.build_blocks(trace)
    assert [n.stage for n in block.nodes if n.column in ("", "QKV")] == ["fused", "merge", "out"]
    page = render_html(trace)
    assert "The fused kernel computes scores of shape" in page
    assert f"<b>{B * H * SQ * SK * 4} B</b>" in page


def test_same_shaped_layers_draw_one_diagram():
    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(CrossAttention() for _ in range(3))

        def forward(self, x, memory):
            for layer in self.layers:
                x = layer(x, memory)
            return x

    trace = shapeguard.trace(Stack(), *cross_inputs())
    blocks = [b for b in _flow.build_blocks(trace) if b.nodes]
    assert [b.name for b in blocks] == ["layers.0 (CrossAttention)"]
    assert blocks[0].same_as == ["layers.1 (CrossAttention)", "layers.2 (CrossAttention)"]
    assert "Same shapes in 2 more" in render_html(trace)


def test_meta_trace_says_there_are_no_values():
    with torch.device("meta"):
        model, x = HandAttention(), torch.randn(B, SQ, D)
    trace = shapeguard.trace(model, x)
    assert "meta device: there are no values" in render_html(trace)
    assert capture_attention(model, x) == {}


# -- attention capture -----------------------------------------------------------------------
def test_capture_copies_softmax_weights_of_batch_element_zero():
    model, (x, memory) = CrossAttention(), cross_inputs()
    maps = capture_attention(model, x, memory)
    (entry,) = maps.values()
    assert entry["op"] == "softmax" and entry["shape"] == [B, H, SQ, SK]
    assert entry["module_type"] == "CrossAttention" and entry["dim"] == -1
    heads = entry["heads"]
    assert (len(heads), len(heads[0]), len(heads[0][0])) == (H, SQ, SK)
    for row in heads[1]:
        assert sum(row) == pytest.approx(1.0, abs=1e-5)
    json.dumps(maps)  # plain data: no tensor kept


def test_capture_pools_long_sequences_to_64():
    x = torch.randn(1, 100, D)
    (entry,) = capture_attention(HandAttention(), x).values()
    assert entry["size"] == [100, 100]
    assert (len(entry["heads"][0]), len(entry["heads"][0][0])) == (64, 64)


def test_capture_recomputes_sdpa_weights_causal():
    q, k, v = torch.randn(B, H, SQ, DK), torch.randn(B, H, SQ, DK), torch.randn(B, H, SQ, DK)
    (entry,) = capture_attention(
        lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    ).values()
    expected = torch.softmax(
        (q[0] @ k[0].transpose(-2, -1) / DK**0.5).masked_fill(
            ~torch.ones(SQ, SQ, dtype=torch.bool).tril(), float("-inf")
        ),
        dim=-1,
    )
    assert torch.allclose(torch.tensor(entry["heads"]), expected, atol=1e-5)


def test_capture_gives_multihead_attention_callers_what_they_asked_for():
    mha = torch.nn.MultiheadAttention(D, H, batch_first=True)
    x, _ = cross_inputs()
    out, averaged = mha(x, x, x)
    maps = capture_attention(mha, x, x, x)
    (entry,) = maps.values()
    assert entry["shape"] == [B, H, SQ, SQ]
    per_head = torch.tensor(entry["heads"])
    assert torch.allclose(per_head.mean(dim=0), averaged[0].detach(), atol=1e-5)


class _Recorded(torch.nn.Module):
    """Keeps what its attention returned, and which function modes were on the stack."""

    def __init__(self, attention: torch.nn.Module, **call) -> None:
        super().__init__()
        self.attn, self.call, self.seen = attention, call, []

    def forward(self, x):
        modes = torch.overrides._get_current_function_mode_stack()
        out = self.attn(x, x, x, **self.call)
        self.seen.append((modes, out))
        return out[0]


def test_capture_leaves_the_models_calls_as_they_were():
    # An observer never changes a call: nn.MultiheadAttention asked for no weights runs as
    # it does unobserved (bitwise), and the weights still come, per head, named by path.
    model = _Recorded(torch.nn.MultiheadAttention(D, H, batch_first=True), need_weights=False)
    x, _ = cross_inputs()
    with torch.no_grad():
        plain = model(x)
    (entry,) = capture_attention(model, x).values()
    (modes, (out, weights)) = model.seen[-1]
    assert weights is None and torch.equal(out, plain)
    assert entry["module"] == "attn" and entry["module_type"] == "MultiheadAttention"
    assert entry["shape"] == [B, H, SQ, SQ] and entry["op"] == "multi_head_attention_forward"
    # One function mode on torch's stack, the session's interceptor: no mode of its own.
    assert [getattr(m, "shapeguard_interceptor", False) for m in modes] == [True]


def test_capture_reads_the_dropout_the_call_drew():
    mha = torch.nn.MultiheadAttention(D, H, dropout=0.5, batch_first=True).train()
    x, _ = cross_inputs()
    torch.manual_seed(3)
    with torch.no_grad():
        _, averaged = mha(x, x, x)
    torch.manual_seed(3)
    (entry,) = capture_attention(mha, x, x, x).values()
    per_head = torch.tensor(entry["heads"])
    assert torch.allclose(per_head.mean(dim=0), averaged[0], atol=1e-5)


def test_capture_reads_a_functional_call_made_by_position():
    mha = torch.nn.MultiheadAttention(D, H)
    x = torch.randn(SQ, B, D)
    positional = (
        x, x, x, D, H, mha.in_proj_weight, mha.in_proj_bias, None, None, False, 0.0,
        mha.out_proj.weight, mha.out_proj.bias, False, None, False,
    )  # fmt: skip
    maps = capture_attention(lambda: F.multi_head_attention_forward(*positional))
    (entry,) = maps.values()
    assert entry["shape"] == [B, H, SQ, SQ]
    assert entry["location"].startswith("tests/test_report_html.py:")


def test_capture_inside_a_trace_adds_nothing_to_it():
    model, x = HandAttention(), torch.randn(B, SQ, D)
    with shapeguard.trace() as t:
        model(x)
        events = t.event_count
        assert capture_attention(model, x)
        model(x)
    assert t.event_count == 2 * events and not t.findings


def test_capture_leaves_no_hook_mode_or_switch_behind():
    hooks = torch.nn.modules.module
    before = (len(hooks._global_forward_pre_hooks), len(hooks._global_forward_hooks))
    capture_attention(HandAttention(), torch.randn(B, SQ, D))
    assert (len(hooks._global_forward_pre_hooks), len(hooks._global_forward_hooks)) == before
    assert not torch.overrides._is_torch_function_mode_enabled()
    assert shapeguard.is_enabled()


# -- heatmaps -------------------------------------------------------------------------------
def test_heatmaps_are_png_images_one_per_head(cross_trace):
    page = render_html(cross_trace, capture_attention(CrossAttention(), *cross_inputs()))
    assert page.count('<img class="heat"') == H
    png = _png.encode_png([[(0, 0, 0), (255, 255, 255)]] * 3)
    assert png.startswith(b"\x89PNG") and struct.unpack(">II", png[16:24]) == (2, 3)


def test_no_attention_explains_how_to_get_it(cross_trace):
    assert "capture_attention(model, *inputs)" in render_html(cross_trace)


# -- a real browser ----------------------------------------------------------------------------
def _chromium(*args: str, user_data: pathlib.Path) -> subprocess.CompletedProcess:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={user_data}",
        "--enable-logging=stderr",
        "--v=0",
    ]
    return subprocess.run(
        [CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120, check=False
    )


def _png_pixels(data: bytes) -> list[bytes]:
    """Rows of raw pixel bytes of an 8-bit, non-interlaced RGB or RGBA PNG."""
    width, height, depth, kind = struct.unpack(">IIBB", data[16:26])
    assert depth == 8 and kind in (2, 6), (depth, kind)
    channels = 3 if kind == 2 else 4
    chunks, pos = [], 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        if data[pos + 4 : pos + 8] == b"IDAT":
            chunks.append(data[pos + 8 : pos + 8 + length])
        pos += 12 + length
    raw = zlib.decompress(b"".join(chunks))
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind_byte, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind_byte == 1:
                line[i] = (line[i] + left) & 255
            elif kind_byte == 2:
                line[i] = (line[i] + up) & 255
            elif kind_byte == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind_byte == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                pred = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + pred) & 255
        rows.append(bytes(line))
        previous = line
    return [bytes(r[i : i + 3]) for r in rows[::7] for i in range(0, len(r), channels * 7)]


@pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason="no /usr/bin/chromium: install Debian's `chromium` package to run the browser test",
)
def test_report_loads_in_headless_chromium_without_errors(tmp_path):
    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = HandAttention(bug="softmax_axis")  # one warning, drawn in orange
            self.cross_attn = CrossAttention()

        def forward(self, x, memory):
            return self.cross_attn(self.self_attn(x), memory)

    trace = shapeguard.Trace(mode="warn")
    model, (x, memory) = Decoder(), cross_inputs()
    with warnings.catch_warnings(record=True), trace:
        warnings.simplefilter("always")
        model(x, memory)
    assert [f.kind for f in trace.findings] == ["softmax_axis"]
    page = tmp_path / "report.html"
    page.write_text(render_html(trace, capture_attention(model, x, memory)))
    url = page.as_uri()

    dom = _chromium("--dump-dom", url, user_data=tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body[^>]*>", dom.stdout).group(0)
    assert 'data-ready="1"' in body, "the page's script did not finish"
    assert "data-js-error" not in body, body  # set by the page's error trap
    assert re.search(r"<title>(.*?)</title>", dom.stdout).group(1) == "shapeguard report"
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], console

    shot = tmp_path / "report.png"
    taken = _chromium(
        f"--screenshot={shot}", "--window-size=1280,1600", url, user_data=tmp_path / "profile-shot"
    )
    assert taken.returncode == 0 and shot.exists(), taken.stderr[-2000:]
    pixels = _png_pixels(shot.read_bytes())
    white = sum(p == b"\xff\xff\xff" for p in pixels)
    assert len(set(pixels)) > 50, "the screenshot has almost no distinct colors"
    assert white / len(pixels) < 0.95, "the screenshot is (almost) blank"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "html-report.png")


@pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason="no /usr/bin/chromium: install Debian's `chromium` package to run the browser test",
)
def test_reach_pictures_load_in_headless_chromium_without_errors(tmp_path):
    """The reach section of a real trace (a causal layer, example 1 left-padded by two
    tokens) drawn by a real browser: no console error, its SVGs there, not blank."""
    from reach_pictures import left_padded_trace, reach_page

    trace = left_padded_trace()
    assert [r.op for r in trace.reach] == ["softmax"]
    page = tmp_path / "reach.html"
    page.write_text(reach_page(trace))
    url = page.as_uri()
    dom = _chromium("--dump-dom", url, user_data=tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "data-js-error" not in dom.stdout
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], console
    assert "causal + padding: keys 0..1 in example 1" in dom.stdout
    assert dom.stdout.count('<svg class="reach"') == 2  # examples 0 and 2 alike, example 1
    assert dom.stdout.count('class="pad"') == 1

    shot = tmp_path / "reach.png"
    taken = _chromium(
        f"--screenshot={shot}", "--window-size=720,330", url, user_data=tmp_path / "profile-shot"
    )
    assert taken.returncode == 0 and shot.exists(), taken.stderr[-2000:]
    pixels = _png_pixels(shot.read_bytes())
    assert b"\x34\x51\xb2" in pixels, "no cell drawn in the seen color"
    assert b"\xf6\xd7\xa7" in pixels, "no padding drawn"
    assert sum(p == b"\xff\xff\xff" for p in pixels) / len(pixels) < 0.97, "almost blank"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "reach.png")
