"""Mask, elementwise, score-bias and nn.MultiheadAttention rules claim only what the code
establishes (issue 26).

Each idiom below is correct code nobody here wrote that a rule once read as a bug, because
it took an axis from its position, a tensor's role from its name or "softmax gives NaN"
from -inf alone. Each runs in two code styles or more at three size settings (pairwise
distinct; coincident batch == heads == seq == d_k; realistic) and must be silent; next to
it, the bug the rule exists for is still found, with its message. The CLIP and
hyunwoongko cases are bugs injected into the layouts of those repositories, with the
hint that leads to the fix.
"""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import shapeguard
from shapeguard import ShapeError, ShapeWarning

# These tests provoke ShapeWarnings on purpose and assert on them.
pytestmark = pytest.mark.no_shapeguard

SIZES = {
    "distinct": (2, 3, 5, 11),  # batch, heads, seq, d_k
    "coincident": (4, 4, 4, 4),
    "realistic": (4, 8, 64, 64),
}
sizes = pytest.mark.parametrize("size", list(SIZES.values()), ids=list(SIZES))


def findings(model, *args, **kwargs):
    """Findings of one traced forward in warn mode, with the ShapeWarnings caught."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        with torch.no_grad():
            trace = shapeguard.trace(model, *args, mode="warn", **kwargs)
    return trace.findings


def silent(model, *args, **kwargs):
    """No finding in warn mode, and raise mode runs to the end."""
    found = findings(model, *args, **kwargs)
    assert found == [], [f.message for f in found]
    with torch.no_grad():
        shapeguard.trace(model, *args, **kwargs)


def only(found, kind):
    assert [f.kind for f in found] == [kind], [f.message for f in found]
    return found[0]


def heads_of(x, n_heads):
    """[batch, seq, heads * d_k] -> [batch, heads, seq, d_k]."""
    batch, seq, width = x.shape
    return x.view(batch, seq, n_heads, width // n_heads).transpose(1, 2)


class Scores(nn.Module):
    """Query-key scores of a projection, [batch, heads, seq_q, seq_k]."""

    def __init__(self, heads, d_k):
        super().__init__()
        self.n_heads, self.d_k = heads, d_k
        self.q = nn.Linear(heads * d_k, heads * d_k)
        self.k = nn.Linear(heads * d_k, heads * d_k)
        self.v = nn.Linear(heads * d_k, heads * d_k)

    def forward(self, x):
        q, k, v = (heads_of(p(x), self.n_heads) for p in (self.q, self.k, self.v))
        return q @ k.transpose(-2, -1) / math.sqrt(self.d_k), v


# -- F9: the method form x.where(cond, y) ---------------------------------------------------
class Where(nn.Module):
    """Values chosen by a bool condition (Longformer's `x.where(mask.bool(), y)`), in the
    function and method forms, with a tensor or a number for the other values."""

    def __init__(self, style):
        super().__init__()
        self.style = style

    def forward(self, x, keep):
        if self.style == "method":
            return x.where(keep, torch.zeros(()))
        if self.style == "method_scalar":
            return x.where(keep, 0.0)
        if self.style == "function":
            return torch.where(keep, x, torch.zeros_like(x))
        return torch.where(keep, x, 0.0)


WHERE_STYLES = ["method", "method_scalar", "function", "function_scalar"]


@sizes
@pytest.mark.parametrize("style", WHERE_STYLES)
def test_where_in_every_form_is_silent(size, style):
    batch, heads, seq, d_k = size
    x = torch.randn(batch, seq, heads * d_k)
    keep = torch.rand(batch, seq, 1) > 0.5
    silent(Where(style), x, keep)


class FloatCondition(nn.Module):
    def __init__(self, method):
        super().__init__()
        self.method = method

    def forward(self, x, keep):
        if self.method:
            return x.where(keep.float(), 0.0)
        return torch.where(keep.float(), x, 0.0)


@sizes
@pytest.mark.parametrize("method", [True, False], ids=["method", "function"])
def test_a_float_condition_is_still_reported(size, method):
    batch, heads, seq, d_k = size
    x, keep = torch.randn(batch, seq, heads * d_k), torch.rand(batch, seq, 1) > 0.5
    with pytest.raises(ShapeError) as info:
        shapeguard.trace(FloatCondition(method), x, keep)
    assert info.value.kind == "mask_dtype"
    spelled = "x.where(keep.float(), ...)" if method else "torch.where(keep.float(), ...)"
    assert str(info.value).splitlines()[0] == (
        f"{spelled}: keep.float() is float32, where wants bool"
    )
    assert info.value.hint.startswith("compare it first")


@sizes
@pytest.mark.parametrize("name", ["longformer", "led"])
def test_longformer_and_led_run_in_raise_mode(size, name):
    """The sweep's Longformer and LED raised on every forward (F9)."""
    tf = pytest.importorskip("transformers")
    batch, heads, seq, d_k = size
    config = tf.AutoConfig.for_model(
        name,
        vocab_size=128,
        num_attention_heads=heads,
        intermediate_size=32,
        attention_window=4 if name == "longformer" else [4, 4],
        max_position_embeddings=max(128, seq + 8),
        pad_token_id=1,
    )
    if name == "longformer":
        config.update({"hidden_size": heads * d_k, "num_hidden_layers": 2})
        model = tf.LongformerModel._from_config(config).eval()
    else:
        config.update(
            {
                "d_model": heads * d_k,
                "encoder_layers": 2,
                "decoder_layers": 2,
                "encoder_attention_heads": heads,
                "decoder_attention_heads": heads,
                "encoder_ffn_dim": 32,
                "decoder_ffn_dim": 32,
                "max_encoder_position_embeddings": max(128, seq + 8),
                "max_decoder_position_embeddings": max(128, seq + 8),
            }
        )
        model = tf.LEDModel._from_config(config).eval()
    torch.manual_seed(0)
    ids = torch.randint(3, 128, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, seq // 2 :] = 0
    kwargs = {"attention_mask": mask}
    if name == "led":
        kwargs["decoder_input_ids"] = torch.randint(3, 128, (batch, 3))
    # As the sweep ran them: a block of code traced around the call, in warn mode and in
    # raise mode (the mode guard uses).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers pads to the window and says so
        with torch.no_grad(), shapeguard.trace(mode="warn") as trace:
            model(ids, **kwargs)
        assert trace.findings == [], [f.message for f in trace.findings]
        with torch.no_grad(), shapeguard.trace():
            model(ids, **kwargs)


# -- F10: a bool used as 0/1 outside attention ------------------------------------------------
class Recurrence(nn.Module):
    """RecurrentGemma's RG-LRU: the gate is reset to 1 at a segment start (`reset + ~reset *
    a`, a bool used as 0/1), then the state runs along the sequence."""

    def __init__(self, width, style):
        super().__init__()
        self.style = style
        self.gate = nn.Linear(width, width)

    def forward(self, x, reset):
        a = torch.sigmoid(self.gate(x))
        if self.style == "operator":
            multiplier = reset + ~reset * a
        else:
            multiplier = torch.add(torch.logical_not(reset) * a, reset)
        state, states = torch.zeros_like(x[:, 0]), []
        for t in range(x.shape[1]):
            state = multiplier[:, t] * state + x[:, t]
            states.append(state)
        return torch.stack(states, dim=1)


@sizes
@pytest.mark.parametrize("style", ["operator", "torch_add"])
def test_a_bool_reset_in_a_recurrence_is_silent(size, style):
    batch, heads, seq, d_k = size
    x = torch.randn(batch, seq, heads * d_k)
    reset = torch.zeros(batch, seq, 1, dtype=torch.bool)
    reset[:, 0] = True
    silent(Recurrence(heads * d_k, style), x, reset)


class BoolAdded(nn.Module):
    """The bug: a bool keep-mask added to query-key scores, which adds 0/1 and hides
    nothing."""

    def __init__(self, heads, d_k):
        super().__init__()
        self.scores = Scores(heads, d_k)

    def forward(self, x, keep):
        scores, v = self.scores(x)
        weights = (scores + keep).softmax(dim=-1)
        return weights @ v


@sizes
def test_a_bool_mask_added_to_scores_is_still_reported(size):
    batch, heads, seq, d_k = size
    x = torch.randn(batch, seq, heads * d_k)
    keep = torch.ones(batch, 1, 1, seq, dtype=torch.bool)
    found = only(findings(BoolAdded(heads, d_k), x, keep), "mask_dtype")
    assert found.message.splitlines()[0] == (
        "scores + keep: keep is a bool mask added to scores: it adds 0/1 and masks nothing"
    )
    assert found.hint.startswith("use masked_fill(~keep, float('-inf')) for a bool keep-mask")


class IntegersAdded(nn.Module):
    """Integers added to query-key scores: a 0/1 attention_mask (the bug), or a bias of
    whole numbers (a distance), whatever the tensor is named."""

    def __init__(self, heads, d_k):
        super().__init__()
        self.scores = Scores(heads, d_k)

    def forward(self, x, mask):
        scores, v = self.scores(x)
        return (scores + mask).softmax(dim=-1) @ v


@sizes
def test_integers_added_to_scores_are_a_mask_by_their_values_not_their_name(size):
    batch, heads, seq, d_k = size
    x = torch.randn(batch, seq, heads * d_k)
    keep = torch.ones(batch, 1, 1, seq, dtype=torch.long)
    keep[0, ..., seq // 2 :] = 0
    found = only(findings(IntegersAdded(heads, d_k), x, keep), "mask_dtype")
    assert found.message.splitlines()[0] == (
        "scores + mask: mask is a int64 mask added to scores: it adds 0/1 and masks nothing"
    )
    distance = torch.arange(seq)[None, :] - torch.arange(seq)[:, None]
    silent(IntegersAdded(heads, d_k), x, distance)


# -- F11: a masked decay matrix with a trailing feature axis -----------------------------------
class DecayMatrix(nn.Module):
    """Kimi-Linear's chunked gated delta rule: a per-feature decay between the positions of
    a chunk, [.., i, j, d], the future masked to -inf, then exponentiated (no softmax)."""

    def __init__(self, style):
        super().__init__()
        self.style = style

    def forward(self, g):
        chunk = g.shape[-2]
        strict = torch.ones(chunk, chunk, dtype=torch.bool).triu(1)
        diff = g.unsqueeze(-2) - g.unsqueeze(-3)
        if self.style == "masked_fill":
            masked = diff.masked_fill(strict[..., None], float("-inf"))
        else:
            masked = torch.where(strict[..., None], float("-inf"), diff)
        return masked.exp()


@sizes
@pytest.mark.parametrize("style", ["masked_fill", "where"])
def test_a_masked_decay_matrix_is_silent(size, style):
    batch, heads, seq, d_k = size
    g = -torch.rand(batch, heads, 1, seq, d_k).cumsum(-2)
    silent(DecayMatrix(style), g)


# -- F12: -inf scores that feed topk ------------------------------------------------------------
def not_ready(seq):
    """As in DeepSeek-V4's indexer: query i may pick key j only once j <= i - 2 (a block of
    keys is complete), so the first two queries hide every key (their picks are replaced
    by a sentinel)."""
    return torch.arange(seq)[None, :] > torch.arange(seq)[:, None] - 2


class TopK(nn.Module):
    """Scores masked to -inf where a key is not ready, then the best keys picked; `softmax`
    makes the same scores attention weights instead (the bug counterpart)."""

    def __init__(self, heads, d_k, style, softmax=False):
        super().__init__()
        self.style, self.softmax = style, softmax
        self.scores = Scores(heads, d_k)

    def forward(self, x):
        scores, _ = self.scores(x)
        hide = not_ready(x.shape[1])
        if self.style == "masked_fill":
            masked = scores.masked_fill(hide, float("-inf"))
        else:
            masked = torch.where(hide, float("-inf"), scores)
        if self.softmax:
            return masked.softmax(dim=-1)
        if self.style == "masked_fill":
            return masked.topk(1, dim=-1).indices
        return masked.max(dim=-1).indices


@sizes
@pytest.mark.parametrize("style", ["masked_fill", "where"])
def test_scores_masked_for_topk_are_silent(size, style):
    batch, heads, seq, d_k = size
    silent(TopK(heads, d_k, style), torch.randn(batch, seq, heads * d_k))


@sizes
@pytest.mark.parametrize("style", ["masked_fill", "where"])
def test_the_same_rows_read_by_a_softmax_are_reported_there(size, style):
    batch, heads, seq, d_k = size
    model = TopK(heads, d_k, style, softmax=True)
    found = only(findings(model, torch.randn(batch, seq, heads * d_k)), "mask_fully_masked")
    op, label = ("masked_fill", "hide") if style == "masked_fill" else ("torch.where", "hide")
    rows = batch * heads * 2
    assert found.message.splitlines()[0] == (
        f"{op}: {label} hides every key from {rows} of {batch * heads * seq} query rows "
        "(first at batch 0, heads 0, query 0): softmax gives NaN there"
    )
    # Reported where the softmax reads the rows.
    assert "masked.softmax(dim=-1)" in found.message


def test_a_replayed_forward_still_reports_the_rows_at_its_softmax():
    """The finding waits on the masked tensor, outside what a replay makes: the masking
    step is not replayed, so the third and later forwards find it too."""
    model = TopK(2, 8, "masked_fill", softmax=True)
    x = torch.randn(2, 5, 16)
    for _ in range(4):
        found = only(findings(model, x), "mask_fully_masked")
        assert found.message.startswith("masked_fill: hide hides every key from 8 of 20")


# -- F13: a score bias with one key -------------------------------------------------------------
class OneKey(nn.Module):
    """Attention over one key (an audio encoder's conv stack left one frame), with a
    per-head relative-position bias [heads, seq_q, seq_k]."""

    def __init__(self, heads, d_k, style):
        super().__init__()
        self.style, self.n_heads = style, heads
        self.scores = Scores(heads, d_k)
        self.bias = nn.Parameter(torch.randn(heads, 64, 64))

    def forward(self, x, memory):
        q = heads_of(self.scores.q(x), self.n_heads)
        k = heads_of(self.scores.k(memory), self.n_heads)
        v = heads_of(self.scores.v(memory), self.n_heads)
        bias = self.bias[:, : q.shape[2], : k.shape[2]]
        if self.style == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        scores = q @ k.transpose(-2, -1) + bias
        return scores.softmax(dim=-1) @ v


@sizes
@pytest.mark.parametrize("style", ["add", "sdpa"])
def test_a_bias_over_one_key_is_silent(size, style):
    batch, heads, seq, d_k = size
    x, memory = torch.randn(batch, seq, heads * d_k), torch.randn(batch, 1, heads * d_k)
    silent(OneKey(heads, d_k, style), x, memory)


# -- the CLIP vision tower: a seq-first nn.MultiheadAttention given [batch, seq, width] ---------
class VisionTower(nn.Module):
    """openai/CLIP's VisionTransformer: conv patches, a class token, positions, then a
    seq-first nn.MultiheadAttention after the NLD -> LND permute (`bug`: without it)."""

    def __init__(self, heads, d_k, grid, style="permute", bug=False):
        super().__init__()
        width, patch = heads * d_k, 4
        self.style, self.bug = style, bug
        self.conv1 = nn.Conv2d(3, width, kernel_size=patch, stride=patch, bias=False)
        self.class_embedding = nn.Parameter(torch.randn(width))
        self.positional_embedding = nn.Parameter(torch.randn(grid[0] * grid[1] + 1, width))
        self.attn = nn.MultiheadAttention(width, heads)  # batch_first=False

    def forward(self, x):
        x = self.conv1(x)
        x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)  # [batch, grid**2, width]
        cls = self.class_embedding + torch.zeros(x.shape[0], 1, x.shape[-1])
        x = torch.cat([cls, x], dim=1) + self.positional_embedding
        if not self.bug:
            x = x.permute(1, 0, 2) if self.style == "permute" else x.transpose(0, 1)
        x = self.attn(x, x, x, need_weights=False)[0]
        if not self.bug:
            x = x.permute(1, 0, 2) if self.style == "permute" else x.transpose(0, 1)
        return x[:, 0, :]


def image(size):
    batch, _, seq, _ = size
    grid = (1, seq)  # seq patches of 4 x 4 pixels
    return torch.randn(batch, 3, 4 * grid[0], 4 * grid[1]), grid


@sizes
@pytest.mark.parametrize("style", ["permute", "transpose"])
def test_clip_vision_tower_with_its_permute_is_silent(size, style):
    _, heads, _, d_k = size
    x, grid = image(size)
    silent(VisionTower(heads, d_k, grid, style), x)


@sizes
def test_clip_vision_tower_without_its_permute_attends_across_the_batch(size):
    batch, heads, seq, d_k = size
    x, grid = image(size)
    found = only(findings(VisionTower(heads, d_k, grid, bug=True), x), "mha_batch_first")
    first = found.message.splitlines()[0]
    assert first.startswith(f"MultiheadAttention(batch_first=False) got x [batch={batch}, ")
    assert first.endswith(
        f"it reads [seq, batch, embed_dim], so it attends across the {batch} examples of the "
        "batch, once per token"
    )
    assert found.hint == (
        "build nn.MultiheadAttention(..., batch_first=True), or pass x.transpose(0, 1) (and "
        "the same for key and value) and transpose the output back"
    )


class SeqFirstConv(nn.Module):
    """Correct seq-first code: a conv front end, [batch, width, frames] permuted to
    [frames, batch, width] for a seq-first nn.MultiheadAttention."""

    def __init__(self, heads, d_k, style):
        super().__init__()
        self.style = style
        self.conv = nn.Conv1d(8, heads * d_k, 3, padding=1)
        self.attn = nn.MultiheadAttention(heads * d_k, heads)

    def forward(self, x):
        h = self.conv(x)
        h = h.permute(2, 0, 1) if self.style == "permute" else h.transpose(1, 2).transpose(0, 1)
        return self.attn(h, h, h, need_weights=False)[0]


@sizes
@pytest.mark.parametrize("style", ["permute", "transposes"])
def test_seq_first_attention_after_a_conv_is_silent(size, style):
    batch, heads, seq, d_k = size
    silent(SeqFirstConv(heads, d_k, style), torch.randn(batch, 8, seq))


# -- hints: CLIP's text tower without its permute ------------------------------------------------
class TextTower(nn.Module):
    """openai/CLIP's text transformer: token and position embeddings, a causal float
    attn_mask [seq, seq] built once, a seq-first nn.MultiheadAttention after the NLD -> LND
    permute (`bug`: without it). `conv`: a conv front end instead of token ids."""

    def __init__(self, heads, d_k, seq, bug=False, conv=False):
        super().__init__()
        width = heads * d_k
        self.bug, self.conv = bug, conv
        self.token_embedding = nn.Embedding(100, width)
        self.frames = nn.Conv1d(8, width, 1)
        self.positional_embedding = nn.Parameter(torch.randn(seq, width))
        self.attn = nn.MultiheadAttention(width, heads)
        mask = torch.empty(seq, seq).fill_(float("-inf")).triu_(1)
        self.register_buffer("attn_mask", mask)

    def forward(self, text):
        x = self.frames(text).transpose(1, 2) if self.conv else self.token_embedding(text)
        x = x + self.positional_embedding
        if not self.bug:
            x = x.permute(1, 0, 2)
        x = self.attn(x, x, x, need_weights=False, attn_mask=self.attn_mask)[0]
        if not self.bug:
            x = x.permute(1, 0, 2)
        return x


@sizes
def test_clip_text_tower_with_its_permute_is_silent(size):
    batch, heads, seq, d_k = size
    silent(TextTower(heads, d_k, seq), torch.randint(0, 100, (batch, seq)))


def mha_attn_mask_error(model, x):
    with pytest.raises(ShapeError) as info:
        shapeguard.trace(model, x)
    assert info.value.kind == "mha_attn_mask"
    return info.value


@pytest.mark.parametrize(
    "size", [SIZES["distinct"], SIZES["realistic"]], ids=["distinct", "realistic"]
)
def test_clip_text_tower_without_its_permute_gets_no_mask_reshaping_hint(size):
    """Nothing but the input's usual layout says its axis 0 is the batch: the hint says how
    the module reads the query and the mask, and proposes no reshape of the mask (which
    would hide the real bug). With batch == seq the mask fits, and torch runs it."""
    batch, heads, seq, d_k = size
    error = mha_attn_mask_error(
        TextTower(heads, d_k, seq, bug=True), torch.randint(0, 100, (batch, seq))
    )
    assert str(error).splitlines()[0] == (
        f"MultiheadAttention: attn_mask [{seq}, {seq}] is neither [seq_q={batch}, "
        f"seq_k={batch}] nor [batch*heads={seq * heads}, seq_q={batch}, seq_k={batch}]"
    )
    assert error.hint == (
        "batch_first=False reads the query as [seq, batch, embed_dim], so seq_q is its axis 0 "
        f"({batch}): check the query's layout first, then that attn_mask is [seq_q, seq_k] or "
        "[batch * num_heads, seq_q, seq_k]"
    )
    assert "repeat" not in error.hint and f"[{batch}, {batch}]" not in error.hint


@pytest.mark.parametrize(
    "size", [SIZES["distinct"], SIZES["realistic"]], ids=["distinct", "realistic"]
)
def test_a_conv_batch_where_the_module_reads_seq_gets_the_layout_hint(size):
    """A conv's first axis is the batch by its documented layout: the hint says the query
    is batch-first."""
    batch, heads, seq, d_k = size
    model = TextTower(heads, d_k, seq, bug=True, conv=True)
    error = mha_attn_mask_error(model, torch.randn(batch, 8, seq))
    assert error.hint == (
        "x is [batch, seq, embed_dim] (its axis 0 holds the examples): batch_first=False reads "
        "it as [seq, batch, embed_dim], so seq_q is the batch; pass x.permute(1, 0, 2) (and "
        "the same for key and value) and permute the output back, or build "
        "nn.MultiheadAttention(..., batch_first=True)"
    )


# -- hints: hyunwoongko's decoder, tril replaced by triu, padded targets -------------------------
class PaddedDecoder(nn.Module):
    """hyunwoongko/transformer's decoder self-attention: the target's padding on the query
    axis ANDed with a causal triangle ([batch, 1, seq, 1] & [seq, seq]), masked to -10000."""

    def __init__(self, heads, d_k, style, triangle="tril", pad=1):
        super().__init__()
        self.style, self.triangle, self.pad = style, triangle, pad
        self.embedding = nn.Embedding(100, heads * d_k)
        self.scores = Scores(heads, d_k)

    def forward(self, trg):
        seq = trg.shape[1]
        trg_pad_mask = (trg != self.pad).unsqueeze(1).unsqueeze(3)
        trg_sub_mask = getattr(torch, self.triangle)(torch.ones(seq, seq)).type(torch.ByteTensor)
        mask = trg_pad_mask & trg_sub_mask
        score, v = self.scores(self.embedding(trg))
        if self.style == "masked_fill":
            score = score.masked_fill(mask == 0, -10000)
        else:
            score = torch.where(mask == 0, -10000.0, score)
        return torch.softmax(score, dim=-1) @ v


def targets(size):
    """Right-padded targets (pad id 1): the first example's last half is padding."""
    batch, _, seq, _ = size
    torch.manual_seed(0)
    trg = torch.randint(2, 100, (batch, seq))
    trg[0, seq - seq // 2 :] = 1
    return trg


@sizes
@pytest.mark.parametrize("style", ["masked_fill", "where"])
def test_padded_causal_decoder_is_silent(size, style):
    _, heads, _, d_k = size
    silent(PaddedDecoder(heads, d_k, style), targets(size))


@sizes
@pytest.mark.parametrize("style", ["masked_fill", "where"])
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
def test_triu_for_tril_is_the_direction_bug_with_padding_too(size, style, padded):
    """Judged by what the real queries see of the real keys: the padded query rows, which
    hide every key, do not turn the swapped triangle into a claim about real queries."""
    batch, heads, seq, d_k = size
    trg = targets(size) if padded else torch.randint(2, 100, (batch, seq))
    model = PaddedDecoder(heads, d_k, style, triangle="triu")
    found = only(findings(model, trg), "mask_direction")
    op = "masked_fill" if style == "masked_fill" else "torch.where"
    assert found.message.splitlines()[0] == (
        f"{op}: mask == 0 hides the past instead of the future: each query sees itself and "
        "later keys only"
    )
    assert found.hint.startswith("tril and triu are swapped")


@sizes
@pytest.mark.parametrize("style", ["masked_fill", "where"])
def test_query_axis_padding_on_the_left_gets_a_hint_that_names_both_readings(size, style):
    """Left-padded targets with padding on the query axis only: the padded rows hide every
    key while real queries still see the padded keys. Nothing in the mask tells those rows
    from real queries left with nothing, so the hint says what the mask shows (other
    queries see these positions as keys) and gives the fix for each reading."""
    batch, heads, seq, d_k = size
    trg = targets(size).flip(-1)
    found = only(findings(PaddedDecoder(heads, d_k, style), trg), "mask_fully_masked")
    op = "masked_fill" if style == "masked_fill" else "torch.where"
    padded = seq // 2
    assert found.message.splitlines()[0] == (
        f"{op}: mask == 0 hides every key from {padded * heads} of {batch * heads * seq} query "
        "rows (first at batch 0, heads 0, query 0): softmax spreads those rows evenly over "
        "every key, hidden ones included"
    )
    reads = (
        "masked_fill hides where the mask is True"
        if style == "masked_fill"
        else "torch.where puts the fill where the condition is True"
    )
    assert found.hint == (
        "each query must see at least one key, and other queries see these rows' own "
        "positions as keys, so the mask treats them as real tokens: if they are padding, "
        "hide them as keys too (padding goes on the key axis, [batch, 1, 1, seq_k]); else "
        f"check the mask's polarity ({reads}) and that a causal mask hides only the keys "
        "after each query, never its own"
    )


class FoldedHeads(nn.Module):
    """fairseq's attention: scores [batch * heads, seq_q, seq_k] viewed as [batch, heads,
    seq_q, seq_k] for the key padding mask, then folded back (view or reshape) for the
    softmax."""

    def __init__(self, heads, d_k, style):
        super().__init__()
        self.n_heads, self.style = heads, style
        self.scores = Scores(heads, d_k)

    def forward(self, x, key_padding_mask):
        scores, _ = self.scores(x)
        batch, heads, seq, _ = scores.shape
        folded = scores.reshape(batch * heads, seq, seq)
        unfolded = folded.view(batch, heads, seq, seq)
        hidden = key_padding_mask[:, None, None, :]
        masked = unfolded.masked_fill(hidden, float("-inf"))
        if self.style == "view":
            folded = masked.view(batch * heads, seq, seq)
        else:
            folded = masked.reshape(batch * heads, seq, seq)
        return F.softmax(folded, dim=-1)


@sizes
@pytest.mark.parametrize("style", ["view", "reshape"])
def test_rows_hidden_whole_are_found_through_a_fold_of_the_heads(size, style):
    """An example whose every key is padding, masked on [batch, heads, seq_q, seq_k] and
    read by a softmax on [batch * heads, seq_q, seq_k]: the rows reach the softmax."""
    batch, heads, seq, d_k = size
    padding = torch.zeros(batch, seq, dtype=torch.bool)
    silent(FoldedHeads(heads, d_k, style), torch.randn(batch, seq, heads * d_k), padding)
    padding[-1] = True
    model = FoldedHeads(heads, d_k, style)
    found = only(
        findings(model, torch.randn(batch, seq, heads * d_k), padding), "mask_fully_masked"
    )
    assert found.message.splitlines()[0] == (
        f"masked_fill: hidden hides every key from {heads * seq} of {batch * heads * seq} query "
        f"rows (first at batch {batch - 1}, heads 0, query 0): softmax gives NaN there"
    )


# -- cache_axis: the sequence axis named only where structure or the shapes say which --------------
class CacheStep(nn.Module):
    """One decode step that grows a cache of keys held in a buffer along the heads (the
    bug), batch-first [batch, heads, seq, d_k] or seq-first [seq, batch, heads, d_k]."""

    def __init__(self, heads, d_k, batch, seq_first, cached=4):
        super().__init__()
        self.n_heads, self.seq_first = heads, seq_first
        self.W_k = nn.Linear(heads * d_k, heads * d_k)
        shape = (cached, batch, heads, d_k) if seq_first else (batch, heads, cached, d_k)
        self.register_buffer("past_k", torch.randn(shape))

    def forward(self, x):
        if self.seq_first:  # x: [1, batch, width]
            k = self.W_k(x).view(x.shape[0], x.shape[1], self.n_heads, -1)
            return torch.cat([self.past_k, k], dim=2)
        k = heads_of(self.W_k(x), self.n_heads)  # x: [batch, 1, width]
        return torch.cat([self.past_k, k], dim=1)


@sizes
@pytest.mark.parametrize("seq_first", [False, True], ids=["batch_first", "seq_first"])
def test_a_cache_grown_along_the_heads_names_the_sequence_only_where_it_is_known(size, seq_first):
    """Batch-first, the cache is longer than the new keys on one axis: the sequence, where
    it grew before (dim=2). Seq-first, only the input's usual layout would name an axis,
    and it would name the batch: the hint gives no dim."""
    batch, heads, _, d_k = size
    model = CacheStep(heads, d_k, batch, seq_first)
    x = torch.randn(1, batch, heads * d_k) if seq_first else torch.randn(batch, 1, heads * d_k)
    with pytest.raises(ShapeError) as info:
        shapeguard.trace(model, x)
    assert info.value.kind == "cache_axis"
    first = str(info.value).splitlines()[0]
    if seq_first:
        assert first.endswith(
            "a cache of keys or values grows along the sequence, one position per new token"
        )
        assert info.value.hint == (
            "concatenate along the sequence axis, the one each new token adds a position to"
        )
    else:
        assert first.endswith(
            "a cache of keys or values grows along the sequence, axis 2, one position per new token"
        )
        assert info.value.hint == (
            "concatenate along the sequence axis: torch.cat([past_k, k], dim=2)"
        )
