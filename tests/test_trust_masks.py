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


# -- W2: queries against keys that are not their own positions --------------------------------
# A row that hides every key is a real query's only where the mask shows that query's own
# position visible as a key to others; which key is a query's own, structure must say (one
# axis on both sides, or slices of one). Against landmark keys (segment means), against
# another sequence, or for rows the module padded itself, the padded rows are correct.
EMPTY_HINT = (
    "each query must see at least one key: an example whose queries see no key is all "
    "padding (drop it from the batch) or its mask has the wrong polarity ({})"
)


def padding(size, layout):
    """[batch, seq] bool, True at a token: example 0 half padding, example 1 one pad token,
    on the left or the right; None for no padding."""
    batch, _, seq, _ = size
    if layout == "none":
        return None
    keep = torch.ones(batch, seq, dtype=torch.bool)
    for example, pads in enumerate((seq // 2, 1)[:batch]):
        if layout == "left":
            keep[example, :pads] = False
        else:
            keep[example, seq - pads :] = False
    return keep


LAYOUTS = ["none", "left", "right"]


@sizes
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("landmarks", [2, 4])
def test_nystrom_attention_is_silent(size, layout, landmarks):
    """lucidrains' nystrom-attention: queries against landmarks (means of segments of the
    keys), landmarks against keys; a sequence that is not a multiple of the landmarks is
    padded on the left by the module, and those rows are cut off its output."""
    nystrom = pytest.importorskip("nystrom_attention")
    batch, heads, seq, d_k = size
    torch.manual_seed(0)
    model = nystrom.NystromAttention(
        dim=heads * d_k, dim_head=d_k, heads=heads, num_landmarks=landmarks
    ).eval()
    keep = padding(size, layout)
    silent(model, torch.randn(batch, seq, heads * d_k), **({} if keep is None else {"mask": keep}))


def test_nystrom_attention_of_the_world_corpus_is_silent():
    """W2 of docs/world.md: batch == seq == 8, four landmarks of two tokens each."""
    nystrom = pytest.importorskip("nystrom_attention")
    torch.manual_seed(0)
    model = nystrom.NystromAttention(dim=32, dim_head=8, heads=4, num_landmarks=4).eval()
    keep = torch.ones(8, 8, dtype=torch.bool)
    keep[0, 5:] = False
    keep[1, 7:] = False
    silent(model, torch.randn(8, 8, 32), mask=keep)


class Landmarks(nn.Module):
    """Nyström attention written by hand: the queries against landmark keys (the mean of each
    segment of the keys) and the landmark queries against the keys, each masked by the
    padding of its side. The module pads the sequence on the left to a multiple of the
    landmarks and cuts those rows off its output. `style`: view + masked_fill + matmul, or
    reshape + torch.where + einsum. The bug: the landmarks' mask with its polarity flipped,
    so an unpadded example's queries see no landmark."""

    def __init__(self, heads, d_k, landmarks, style, flipped=False):
        super().__init__()
        self.n_heads, self.d_k, self.landmarks = heads, d_k, landmarks
        self.style, self.flipped = style, flipped
        self.qkv = nn.Linear(heads * d_k, 3 * heads * d_k)

    def forward(self, x, keep):
        batch, seq, width = x.shape
        extra = -seq % self.landmarks
        if extra:  # the module's own padding, cut off below
            x = torch.cat((x.new_zeros(batch, extra, width), x), dim=1)
            keep = torch.cat((keep.new_zeros(batch, extra), keep), dim=1)
        total = seq + extra
        segment = total // self.landmarks
        q, k, v = (heads_of(t, self.n_heads) for t in self.qkv(x).split(width, dim=-1))
        q, k, v = (t * keep[:, None, :, None] for t in (q, k, v))
        shape = (batch, self.n_heads, self.landmarks, segment, self.d_k)
        counts = keep.view(batch, 1, self.landmarks, segment).sum(-1)[..., None] + 1e-8
        if self.style == "view":
            q_land = q.view(shape).sum(-2) / counts
            k_land = k.view(shape).sum(-2) / counts
        else:
            q_land = q.reshape(shape).sum(-2) / counts
            k_land = k.reshape(shape).sum(-2) / counts
        seen = keep.view(batch, 1, self.landmarks, segment).any(-1)  # [batch, 1, landmarks]
        if self.flipped:
            seen = ~seen
        low = torch.finfo(x.dtype).min
        to_landmarks = ~(keep[:, None, :, None] & seen[:, :, None, :])
        from_landmarks = ~(seen[:, :, :, None] & keep[:, None, None, :])
        if self.style == "view":
            sim1 = (q @ k_land.transpose(-2, -1)).masked_fill(to_landmarks, low)
            sim3 = (q_land @ k.transpose(-2, -1)).masked_fill(from_landmarks, low)
        else:
            sim1 = torch.einsum("bhid,bhjd->bhij", q, k_land)
            sim3 = torch.einsum("bhid,bhjd->bhij", q_land, k)
            sim1 = torch.where(to_landmarks, low, sim1)
            sim3 = torch.where(from_landmarks, low, sim3)
        out = sim1.softmax(dim=-1) @ (sim3.softmax(dim=-1) @ v)
        out = out.transpose(1, 2).reshape(batch, total, width)
        return out[:, -seq:]


@sizes
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("style", ["view", "reshape"])
def test_hand_written_landmark_attention_is_silent(size, layout, style):
    batch, heads, seq, d_k = size
    torch.manual_seed(0)
    keep = padding(size, layout)
    keep = torch.ones(batch, seq, dtype=torch.bool) if keep is None else keep
    silent(Landmarks(heads, d_k, 2, style), torch.randn(batch, seq, heads * d_k), keep)


@sizes
@pytest.mark.parametrize("style", ["view", "reshape"])
def test_landmarks_hidden_from_every_query_of_an_example_are_still_reported(size, style):
    """The landmarks' mask flipped: the last example, unpadded, sees no landmark at all."""
    batch, heads, seq, d_k = size
    torch.manual_seed(0)
    keep = padding(size, "right")
    model = Landmarks(heads, d_k, 2, style, flipped=True)
    found = findings(model, torch.randn(batch, seq, heads * d_k), keep)
    assert [f.kind for f in found] == ["mask_fully_masked"] * 2, [f.message for f in found]
    op, reads = (
        ("masked_fill", "masked_fill hides where the mask is True")
        if style == "view"
        else ("torch.where", "torch.where puts the fill where the condition is True")
    )
    # An example whose every segment holds a token has every landmark flipped to hidden: its
    # queries see nothing (the module pads an odd sequence on the left to two segments).
    total = seq + seq % 2
    tokens = torch.cat((torch.zeros(batch, total - seq, dtype=torch.bool), keep), dim=1)
    empty = tokens.view(batch, 2, -1).any(-1).all(-1)
    first = int(empty.nonzero()[0, 0])
    assert found[0].message.splitlines()[0] == (
        f"{op}: to_landmarks hides every key from {int(empty.sum()) * heads * total} of "
        f"{batch * heads * total} query rows (first at batch {first}, heads 0, query 0): "
        "softmax spreads those rows evenly over every key, hidden ones included"
    )
    assert found[0].hint == EMPTY_HINT.format(reads)


class CrossAttention(nn.Module):
    """Cross-attention masked on both sides (lucidrains' `mask[:, None, :, None] *
    context_mask[:, None, None, :]`): a padded query's row hides every key, and its output is
    padding. `style`: matmul + masked_fill, einsum + torch.where, or SDPA's bool mask. The
    bug: the context mask with its polarity flipped."""

    def __init__(self, heads, d_k, style, flipped=False):
        super().__init__()
        self.n_heads, self.d_k, self.style, self.flipped = heads, d_k, style, flipped
        self.q = nn.Linear(heads * d_k, heads * d_k)
        self.kv = nn.Linear(heads * d_k, 2 * heads * d_k)

    def forward(self, x, context, keep, context_keep):
        q = heads_of(self.q(x), self.n_heads)
        k, v = (heads_of(t, self.n_heads) for t in self.kv(context).chunk(2, dim=-1))
        if self.flipped:
            context_keep = ~context_keep
        both = keep[:, None, :, None] & context_keep[:, None, None, :]
        if self.style == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=both)
        low = -torch.finfo(q.dtype).max
        if self.style == "matmul":
            scores = (q @ k.transpose(-2, -1) / math.sqrt(self.d_k)).masked_fill(~both, low)
        else:
            scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(self.d_k)
            scores = torch.where(both, scores, low)
        return scores.softmax(dim=-1) @ v


def cross_inputs(size, layout):
    """Queries padded as `layout`; a context two positions longer (at the distinct sizes;
    as long as the queries at the others) whose first example is padded on the right."""
    batch, heads, seq, d_k = size
    other = seq + 2 if size == SIZES["distinct"] else seq
    torch.manual_seed(0)
    keep = padding(size, layout)
    keep = torch.ones(batch, seq, dtype=torch.bool) if keep is None else keep
    context_keep = torch.ones(batch, other, dtype=torch.bool)
    context_keep[0, other - other // 2 :] = False
    return (
        torch.randn(batch, seq, heads * d_k),
        torch.randn(batch, other, heads * d_k),
        keep,
        context_keep,
    )


@sizes
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("style", ["matmul", "einsum", "sdpa"])
def test_cross_attention_that_hides_padded_queries_is_silent(size, layout, style):
    _, heads, _, d_k = size
    silent(CrossAttention(heads, d_k, style), *cross_inputs(size, layout))


@sizes
@pytest.mark.parametrize("style", ["matmul", "sdpa"])
def test_cross_attention_with_its_context_mask_flipped_is_still_reported(size, style):
    """The unpadded contexts (examples 1..) flipped to all hidden: their queries see
    nothing. (An einsum tags its product's axes as queries and keys only where they are
    factors of one dim, so the einsum style's rows are not judged at all.)"""
    batch, heads, seq, d_k = size
    x, context, keep, context_keep = cross_inputs(size, "right")
    model = CrossAttention(heads, d_k, style, flipped=True)
    found = only(findings(model, x, context, keep, context_keep), "mask_fully_masked")
    empty = int(context_keep.all(-1).sum())
    first = int(context_keep.all(-1).nonzero()[0, 0])
    op, label, reads, effect = {
        "matmul": (
            "masked_fill",
            "~both",
            "masked_fill hides where the mask is True",
            "softmax spreads those rows evenly over every key, hidden ones included",
        ),
        "sdpa": (
            "scaled_dot_product_attention",
            "attn_mask",
            "SDPA keeps the keys where a bool attn_mask is True",
            "SDPA returns zeros for them",
        ),
    }[style]
    assert found.message.splitlines()[0] == (
        f"{op}: {label} hides every key from {empty * heads * seq} of {batch * heads * seq} "
        f"query rows (first at batch {first}, heads 0, query 0): {effect}"
    )
    assert found.hint == EMPTY_HINT.format(reads)
