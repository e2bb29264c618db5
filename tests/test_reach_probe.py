"""The reach probe of `shapeguard.check` (issue 28, part 4): which input tokens move which
outputs, measured, and a failure only with a counterexample the unmodified module gives.

Each bug (a future leak, examples mixed, a padded key leak) fails with the cell that
shows it, and each correct counterpart (a causal decoder, a left-padded decoder, a
bidirectional encoder, an output of the last position only) passes or is not applicable
with its reason, at three size settings: pairwise distinct, coincident (batch == seq ==
heads == d_k) and realistic. A tiny Llama and BERT from config run it clean.
"""

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shapeguard import _config
from shapeguard._probes import measured_reach
from shapeguard._probes.check import check
from shapeguard._probes.prepare import prepare_subject
from shapeguard._probes.report import CheckReport
from shapeguard._probes.traced import trace_for_probes
from shapeguard._probes.untouched import untouched

pytestmark = pytest.mark.no_shapeguard  # the probes trace on their own

# (batch, heads, seq, d_k)
SIZES = {
    "distinct": (3, 4, 7, 16),
    "coincident": (4, 4, 4, 4),
    "realistic": (4, 8, 64, 64),
}


class Attention(nn.Module):
    """Self-attention over data x [batch, seq, d_model], with an optional bug."""

    def __init__(self, heads, d_k, *, causal=False, bug=None, last=False):
        super().__init__()
        self.heads, self.d_k, self.causal, self.bug, self.last = heads, d_k, causal, bug, last
        d = heads * d_k
        self.W_q, self.W_k, self.W_v, self.out = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x, mask=None):
        B, T, C = x.shape
        q = self.W_q(x).view(B, T, self.heads, self.d_k).transpose(1, 2)
        k = self.W_k(x).view(B, T, self.heads, self.d_k).transpose(1, 2)
        if self.bug == "batch_view":  # [batch, seq] read as [seq, batch]: examples mixed
            v = self.W_v(x).view(T, B, self.heads, self.d_k).permute(1, 2, 0, 3)
        else:
            v = self.W_v(x).view(B, T, self.heads, self.d_k).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if self.causal:
            later = 2 if self.bug == "future" else 1  # the future leak: query t sees t + 1
            hidden = torch.ones(T, T, dtype=torch.bool).triu(later)
            scores = scores.masked_fill(hidden, float("-inf"))
        keep = None if mask is None else mask[:, None, None, :]
        if keep is not None and self.bug != "pad_after_softmax":
            scores = scores.masked_fill(keep == 0, torch.finfo(scores.dtype).min)
        weights = F.softmax(scores, dim=-1)
        if keep is not None and self.bug == "pad_after_softmax":
            # the padded keys' weights zeroed, but they were in the softmax's sum
            weights = weights.masked_fill(keep == 0, 0.0)
        y = (weights @ v).transpose(1, 2).reshape(B, T, C)
        y = self.out(y)
        if self.bug == "batch_mean":
            y = y - y.mean(dim=0, keepdim=True)
        return y[:, -1] if self.last else y


def model_and_data(size, **how):
    batch, heads, seq, d_k = SIZES[size]
    torch.manual_seed(0)
    model = Attention(heads, d_k, **how).eval()
    x = torch.randn(batch, seq, heads * d_k, generator=torch.Generator().manual_seed(1))
    return model, x, batch, seq


def keep_mask(batch, seq, *, left):
    """1 for real tokens: example e has seq - e of them (at least 2), padded on one side."""
    mask = torch.ones(batch, seq, dtype=torch.long)
    for e in range(1, batch):
        pad = min(e, seq - 2)
        if left:
            mask[e, :pad] = 0
        else:
            mask[e, seq - pad :] = 0
    return mask


def reach_of(model, *args, **kwargs):
    """The reach probe alone, on the subject `check` would make."""
    with untouched(model) as work, torch.no_grad():
        traced = trace_for_probes(work, args, kwargs)
        with _config.disabled():  # the probes' runs are plain forwards, as in check
            subject = prepare_subject(work, model, args, kwargs, traced, None, 0, CheckReport(""))
            return measured_reach(subject)


def first_line(result):
    return result.message.splitlines()[0]


# -- the bugs fail, with the cell that shows them ---------------------------------------------
@pytest.mark.parametrize("size", SIZES)
def test_a_future_leak_fails_with_the_first_output_that_sees_a_later_input(size):
    model, x, batch, seq = model_and_data(size, causal=True, bug="future")
    result = reach_of(model, x)
    assert result.status == "failed"
    first = first_line(result)
    assert first.startswith(
        "changing x at position 1 of example 0, later than 0 (the module is causal: "
    )
    assert " moved the output at position 0 of example 0 by " in first
    lines = result.message.splitlines()
    assert lines[1].startswith(
        "  measured by autograd through x: output 0 of example 0 is moved by inputs 0..1 "
        f"(2 of {seq})"
    )
    assert lines[-1].startswith("  hint: an output sees a later input")
    marks = result.reach.reach.marks
    assert marks[0] == ((0,), 0, ((1, 2),))


@pytest.mark.parametrize(
    ("size", "bug"),
    [(size, "batch_mean") for size in SIZES] + [("distinct", "batch_view")],
)
def test_examples_that_move_each_other_fail(size, bug):
    model, x, batch, seq = model_and_data(size, bug=bug)
    result = reach_of(model, x)
    assert result.status == "failed"
    first = first_line(result)
    assert first.startswith("changing x at position ")
    assert ", another example by " in first
    # the counterexample's input example is not its output example
    said = first.split("changing x at position ")[1]
    moved_in = int(said.split(" of example ")[1].split(" ")[0])
    moved_out = int(said.split(" of example ")[2].split(",")[0])
    assert moved_in != moved_out
    assert "hint: something mixes examples" in result.message
    assert result.reach.crossing  # counted apart from the reach within examples
    assert all(a != b and n > 0 for a, b, n in result.reach.crossing)


@pytest.mark.parametrize("size", ["coincident", "realistic"])
def test_a_view_that_mixes_examples_where_only_sizes_let_it_run_is_the_trace_s(size):
    """batch * seq read as seq * batch: where the sizes alone let the view run, the trace
    finds it, no input keeps a batch axis the probes can read, and the reach claims nothing."""
    model, x, batch, seq = model_and_data(size, bug="batch_view")
    report = check(model, x)
    assert [f.kind for f in report.findings] == ["view_mixes_axes"]
    result = next(r for r in report.results if r.name == "reach")
    assert (result.status, result.message) == ("skipped", "no input has a batch axis")


@pytest.mark.parametrize("size", SIZES)
def test_a_padded_key_leak_fails_at_a_padded_input(size):
    model, x, batch, seq = model_and_data(size, bug="pad_after_softmax")
    mask = keep_mask(batch, seq, left=False)
    result = reach_of(model, x, mask)
    assert result.status == "failed", result.message
    first = first_line(result)
    assert first.startswith("changing x at the padded position ")
    example = int(first.split(" of example ")[1].split(" ")[0])
    position = int(first.split("padded position ")[1].split(" ")[0])
    assert mask[example, position] == 0
    assert ", a real token by " in first
    assert "hint: padded inputs reach real outputs" in result.message
    assert result.reach.reach.padding[example]


class ConvMixer(nn.Module):
    """Attention that hides padded keys, beside a convolution along the positions that
    carries them to their neighbours by design: no promise of the mask is broken."""

    def __init__(self, heads, d_k):
        super().__init__()
        self.attention = Attention(heads, d_k)
        self.conv = nn.Conv1d(heads * d_k, heads * d_k, 3, padding=1)

    def forward(self, x, mask):
        return self.attention(x, mask) + self.conv(x.transpose(1, 2)).transpose(1, 2)


def test_a_padded_input_that_reaches_outputs_outside_attention_is_inconclusive():
    batch, heads, seq, d_k = SIZES["distinct"]
    x = torch.randn(batch, seq, heads * d_k, generator=torch.Generator().manual_seed(1))
    mask = keep_mask(batch, seq, left=False)
    result = reach_of(ConvMixer(heads, d_k).eval(), x, mask)
    assert result.status == "inconclusive", result.message
    assert first_line(result).startswith("the padded positions reach the real tokens through ")
    assert "(a convolution along the positions), not through attention" in first_line(result)


class IndexedTable(nn.Module):
    """Token ids looked up by F.embedding in a table (no nn.Embedding to hook), then
    attention."""

    def __init__(self, heads, d_k, **how):
        super().__init__()
        self.table = nn.Parameter(torch.randn(50, heads * d_k))
        self.attention = Attention(heads, d_k, **how)

    def forward(self, ids):
        return self.attention(F.embedding(ids, self.table))


@pytest.mark.parametrize(("bug", "status"), [(None, "passed"), ("future", "failed")])
def test_without_an_embedding_the_reach_is_measured_by_perturbation(bug, status):
    batch, heads, seq, d_k = SIZES["distinct"]
    ids = torch.randint(0, 50, (batch, seq), generator=torch.Generator().manual_seed(2))
    torch.manual_seed(0)
    result = reach_of(IndexedTable(heads, d_k, causal=True, bug=bug).eval(), ids)
    assert result.status == status, result.message
    how = "perturbation of ids, one run per input cell (no nn.Embedding reads the token ids)"
    assert result.reach.how == how
    if bug:
        assert first_line(result).startswith("changing ids at position 1 of example 0, later ")


# -- the correct counterparts pass, or say why there is nothing to compare --------------------
@pytest.mark.parametrize("size", SIZES)
def test_a_causal_decoder_passes_and_sees_its_prefix(size):
    model, x, batch, seq = model_and_data(size, causal=True)
    result = reach_of(model, x)
    assert result.status == "passed", result.message
    assert first_line(result).startswith(f"measured by autograd through x ({batch} examples x ")
    assert "examples never move each other; no output moves with a later input (causal: " in (
        result.message
    )
    assert result.message.endswith(
        f"output {seq - 1} of example 0 is moved by inputs 0..{seq - 1} ({seq} of {seq})"
    )
    r = result.reach.reach
    for q in r.kept_queries:
        assert r.row((0,), q) == ((0, q + 1),)
    assert not r.marks and not result.reach.crossing


@pytest.mark.parametrize("size", SIZES)
def test_a_left_padded_decoder_passes(size):
    model, x, batch, seq = model_and_data(size, causal=True)
    mask = keep_mask(batch, seq, left=True)
    result = reach_of(model, x, mask)
    assert result.status == "passed", result.message
    assert "a padded input never moves a real output (mask)" in result.message
    r = result.reach.reach
    assert r.padding[1] == ((0, 1),)
    last = r.kept_queries[-1]
    assert r.row((1,), last) == ((1, seq),)  # the padded key is not in the reach


@pytest.mark.parametrize("size", SIZES)
def test_a_bidirectional_encoder_passes_on_its_examples_only(size):
    model, x, batch, seq = model_and_data(size)
    result = reach_of(model, x)
    assert result.status == "passed"
    assert "examples never move each other; output " in result.message
    assert "later input" not in result.message


def test_a_bidirectional_encoder_of_one_example_is_measured_only():
    model, x, _, seq = model_and_data("distinct")
    result = reach_of(model, x[:1])
    assert result.status == "skipped" and not result.applicable
    assert first_line(result) == (
        "measured only, no intent to compare with: one example, no padding mask, not causal "
        "(no causal mask, is_causal or declaration), every output moves with every input "
        f"(bidirectional); output {seq - 1} of example 0 is moved by inputs 0..{seq - 1} "
        f"({seq} of {seq})"
    )
    assert result.reach.reach.seq_k == seq


@pytest.mark.parametrize("size", SIZES)
def test_an_output_of_the_last_position_passes_without_a_causal_claim(size):
    model, x, batch, seq = model_and_data(size, causal=True, last=True)
    result = reach_of(model, x)
    assert result.status == "passed", result.message
    assert "the output keeps no positions, so no claim on later inputs" in result.message
    assert result.message.endswith(
        f"the output of example 0 is moved by inputs 0..{seq - 1} ({seq} of {seq})"
    )
    assert result.reach.positions is False


class Similarity(nn.Module):
    """Every example's pooled attention output against every other's, as CLIP's
    texts-by-images logits: rows that see every example by design."""

    def __init__(self, heads, d_k):
        super().__init__()
        self.attention = Attention(heads, d_k)

    def forward(self, x):
        pooled = self.attention(x).mean(dim=1)
        return pooled @ pooled.t()


@pytest.mark.parametrize("size", ["distinct", "realistic"])
def test_an_output_whose_rows_see_every_example_by_design_is_no_batch_finding(size):
    batch, heads, seq, d_k = SIZES[size]
    x = torch.randn(batch, seq, heads * d_k, generator=torch.Generator().manual_seed(1))
    result = reach_of(Similarity(heads, d_k).eval(), x)
    assert result.status != "failed", result.message
    assert "examples never move each other" not in result.message


# -- in check: the table, the JSON, and the model left as it was ---------------------------
def test_check_reports_the_reach_and_leaves_the_model_as_it_was():
    model, x, _, _ = model_and_data("distinct", causal=True, bug="future")
    model.train()
    model.W_q.weight.requires_grad_(False)
    before = copy.deepcopy(model.state_dict())
    rng = torch.get_rng_state()
    report = check(model, x)
    row = next(r for r in report.results if r.name == "reach")
    assert row.status == "failed" and not report.passed
    assert "reach: changing x at position 1 of example 0" in report.render(width=200)
    data = json.loads(report.to_json())
    entry = next(r for r in data["results"] if r["name"] == "reach")
    assert entry["reach"]["how"] == "autograd through x"
    assert entry["reach"]["rows"][0][0] == [[0, 2]]
    assert entry["reach"]["marks"][0] == {"example": 0, "output": 0, "inputs": [[1, 2]]}
    assert all(r["reach"] is None for r in data["results"] if r["name"] != "reach")
    assert model.training and not model.W_q.weight.requires_grad
    assert model.W_k.weight.requires_grad
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(rng, torch.get_rng_state())
    assert all(p.grad is None for p in model.parameters())


# -- real models ---------------------------------------------------------------------------
def test_a_tiny_llama_with_left_padding_runs_the_probe_clean():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(3, 100, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = keep_mask(3, 7, left=True)
    result = reach_of(model, input_ids=ids, attention_mask=mask)
    assert result.status == "passed", result.message
    assert first_line(result).startswith(
        "measured by autograd through model.embed_tokens (Embedding) (3 examples x 7 outputs "
        "x 7 inputs): examples never move each other; a padded input never moves a real "
        "output (attention_mask); no output moves with a later input (causal: "
    )
    r = result.reach.reach
    assert r.row((2,), 6) == ((2, 7),) and r.row((0,), 3) == ((0, 4),)


def test_a_tiny_bert_with_right_padding_runs_the_probe_clean():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(3, 100, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = keep_mask(3, 7, left=False)
    result = reach_of(model, input_ids=ids, attention_mask=mask)
    assert result.status == "passed", result.message
    assert "a padded input never moves a real output (attention_mask)" in result.message
    assert "later input" not in result.message
    r = result.reach.reach
    assert r.row((2,), 0) == ((0, 5),)  # example 2 has 5 real tokens, every one in reach


# -- the drawing ---------------------------------------------------------------------------
def test_the_html_report_draws_the_measured_reach_with_padding_and_marks():
    import shapeguard
    from shapeguard.report.html import render_html

    model, x, batch, seq = model_and_data("distinct", causal=True, bug="future")
    mask = keep_mask(batch, seq, left=True)
    report = check(model, x, mask)
    record = next(r for r in report.results if r.name == "reach").reach.to_dict()
    page = render_html(shapeguard.trace(model, x, mask), probe_reach=record)
    section = page.split('<section id="measured-reach">')[1].split("</section>")[0]
    assert section.startswith("<h2>Measured reach</h2>")
    assert "Measured by autograd through x." in section
    assert section.count("<figure>") == batch
    assert section.count('class="pad"') == batch - 1  # example 0 has no padding
    assert section.count('class="flag"') == 1
    assert "<title>output 0: inputs 0..1</title>" in section  # the leak: output 0 sees input 1
    assert "No example moves another." in section
    assert "http" not in section


def test_shapeguard_check_html_draws_the_reach(tmp_path):
    import textwrap

    from click.testing import CliRunner

    from shapeguard._cli.commands import cli

    path = tmp_path / "leak.py"
    path.write_text(
        textwrap.dedent(
            """
            import torch
            import torch.nn.functional as F
            from torch import nn


            class Attn(nn.Module):
                def __init__(self, d=64, h=4):
                    super().__init__()
                    self.h, self.hd = h, d // h
                    self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

                def forward(self, x):
                    B, T, C = x.shape
                    q, k, v = self.c_attn(x).split(C, dim=2)
                    q = q.view(B, T, self.h, self.hd).transpose(1, 2)
                    k = k.view(B, T, self.h, self.hd).transpose(1, 2)
                    v = v.view(B, T, self.h, self.hd).transpose(1, 2)
                    hidden = torch.ones(T, T, dtype=torch.bool).triu(2)  # sees t + 1
                    scores = (q @ k.transpose(-2, -1)).masked_fill(hidden, float("-inf"))
                    y = F.softmax(scores / self.hd**0.5, dim=-1) @ v
                    return self.c_proj(y.transpose(1, 2).reshape(B, T, C))
            """
        )
    )
    html = tmp_path / "report.html"
    done = CliRunner().invoke(cli, ["check", str(path), "--html", str(html)])
    assert done.exit_code == 1, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("│ reach"))
    assert "│ FAIL" in row
    page = html.read_text()
    assert '<section id="measured-reach"><h2>Measured reach</h2>' in page
    assert page.count('class="flag"') == 1


def test_clip_s_texts_by_images_logits_make_no_batch_claim():
    """CLIP's first output pairs every image with every text: its rows move with every
    example by design, so the reach probe claims nothing across examples."""
    pytest.importorskip("transformers")
    import real_models

    config = next(c for c in real_models.configs() if c.id == "clip-eager-none-distinct")
    model, args, kwargs = real_models.build(config)
    result = reach_of(model, *args, **kwargs)
    assert result.status == "skipped", result.message
    assert first_line(result).startswith(
        "measured only, no intent to compare with: an output whose examples cannot be told "
        "apart, no padded input"
    )
    assert result.reach.crossing  # measured and kept all the same


def _weighed(broken: str, other_status: str) -> str:
    """The reach result's status after `check` weighs a `broken` failure against the
    probe that edits for that invariant as a whole, which ended `other_status`."""
    from dataclasses import replace

    from shapeguard._probes.check import _weigh_reach
    from shapeguard._probes.reach_record import MeasuredReach
    from shapeguard._probes.result import ProbeResult
    from shapeguard._reach.rows import Reach

    record = MeasuredReach(
        Reach.from_visible(torch.ones(2, 5, 5, dtype=torch.bool), how="probe"), 2, (), "autograd"
    )
    reach = ProbeResult(
        "reach", "failed", "changing x at the padded position 4 of example 0 moved ...", 0.02
    )
    reach.reach = replace(record, broken=broken)
    other = "key-padding invariance" if broken == "padding" else "batch independence"
    report = CheckReport("M", [ProbeResult(other, other_status, "the padded positions reach ...")])
    report.results.append(reach)
    _weigh_reach(report)
    (weighed,) = [r for r in report.results if r.name == "reach"]
    if weighed.status == "inconclusive":
        assert weighed.message.startswith("changing x at the padded position 4 of example 0")
        assert f"but {other} " in weighed.message and "measurements disagree" in weighed.message
        assert weighed.reach is not None and weighed.reach.broken == broken
    return weighed.status


@pytest.mark.parametrize("broken", ["padding", "batch"])
def test_a_reach_failure_the_whole_edit_does_not_confirm_is_inconclusive(broken):
    """conformer (a convolution along the positions) and DeepSeek-V4 (a compressor): key-padding
    invariance is inconclusive where one padded cell moved a real output; nystrom-attention:
    batch independence passed where one redrawn cell moved another example by 9e-4."""
    assert _weighed(broken, "inconclusive") == "inconclusive"
    assert _weighed(broken, "passed") == "inconclusive"
    assert _weighed(broken, "failed") == "failed"
    assert _weighed(broken, "skipped") == "failed"
    assert _weighed("causal", "passed") == "failed"  # no whole-edit probe weighs causality
