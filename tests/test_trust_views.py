"""The view rules (`view_mixes_axes`, `batch_mixing`, `noncontiguous_view`) claim only what
the code establishes (issue 26).

Each idiom below is correct code that a view rule once read as a bug: a flatten to rows
before a per-head norm, positions regrouped into chunks, windows or a relative shift, a
name read from an assignment made later in the function, a batch made by `repeat`, the
batch of a second input, a channels-last feature map, transformers' grouped-query decode.
Each runs in two code styles or more at three size settings (pairwise distinct; coincident
batch == heads == seq == d_k; realistic) and must be silent. Next to them, the bugs the
rules exist for are still found, with the hint that fits the code: a heads split written
`view(B, nh, T, hs)` on a split's columns (nanoGPT), a merge without its transpose after
rotary through complex numbers (meta-llama), a conv's patches flattened by `reshape`
(DINOv2), a window partition without its permute (segment-anything), and ProphetNet's
predict-stream unfold, whose mixing stays within each example.
"""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
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
    assert not trace.internal_errors, trace.internal_errors
    return trace.findings


def silent(model, *args, **kwargs):
    """No finding in warn mode, and raise mode runs to the end."""
    found = findings(model, *args, **kwargs)
    assert found == [], [f.message for f in found]
    with torch.no_grad():
        shapeguard.trace(model, *args, **kwargs)


def only(found, kind):
    assert found and {f.kind for f in found} == {kind}, [f.message for f in found]
    return found[0]


class Matmul(nn.Module):
    """A projection applied with a matmul on its own weight (fairscale's parallel layers,
    Falcon's FalconLinear): its output features carry no parameter's kind."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out, d_in) / math.sqrt(d_in))

    def forward(self, x):
        return x @ self.weight.T


# -- F1: a flatten to rows before a per-token or per-head op -----------------------------------
class Rows(nn.Module):
    """Qwen3-Next's gated norm over each head ([B, S, H, d] -> [B*S*H, d]), ConvBERT's
    dynamic kernels ([B, S, H*k] -> [B*S*H, k, 1]), SEW's learned upsampling
    ([B, S, 2, C] -> [B, 2S, C]) and ProphetNet's main-stream buckets ([B, H, S, n] ->
    [B*H*S, n]): positions major, a factor of the features minor, whole features after."""

    def __init__(self, heads, d_k, style, buckets=6, kernel=3):
        super().__init__()
        self.heads, self.d_k, self.style, self.buckets, self.kernel = (
            heads,
            d_k,
            style,
            buckets,
            kernel,
        )
        width = heads * d_k
        self.proj = nn.Linear(width, width)
        self.norm = nn.LayerNorm(d_k)
        self.kernels = nn.Linear(width, heads * kernel)
        self.up = nn.Linear(width, 2 * width)
        self.rel = nn.Linear(width, buckets * heads)

    def forward(self, x):
        B, S, C = x.shape
        if self.style == "per_head_norm":
            z = self.proj(x).view(B, S, self.heads, self.d_k)
            z = self.norm(z.reshape(-1, z.shape[-1]))
            return z.view(B, S, self.heads * self.d_k)
        if self.style == "dynamic_kernel":
            k = self.kernels(x).reshape(-1, self.kernel, 1)
            return torch.softmax(k, dim=1).view(B, S, -1)
        if self.style == "upsample":  # SEWUpsampling, names and all
            hidden_states = self.up(x)
            bsz, src_len, src_embed_dim = hidden_states.size()
            tgt_len, tgt_embed_dim = src_len * 2, src_embed_dim // 2
            hidden_states = hidden_states.reshape(bsz, src_len, 2, tgt_embed_dim)
            return hidden_states.reshape(bsz, tgt_len, tgt_embed_dim)
        rel = self.rel(x)
        rel = rel.view(rel.shape[:2] + (self.buckets, self.heads)).permute(0, 3, 1, 2)
        rel = rel.reshape((B, self.heads, S) + (-1,))
        return rel.reshape(-1, rel.size(-1)).softmax(-1)


@sizes
@pytest.mark.parametrize("style", ["per_head_norm", "dynamic_kernel", "upsample", "buckets"])
def test_a_flatten_to_rows_is_silent(size, style):
    batch, heads, seq, d_k = size
    silent(Rows(heads, d_k, style), torch.randn(batch, seq, heads * d_k))


class MergeBeforeTranspose(nn.Module):
    """The bug the merge rule is for: [B, H, S, d] reshaped to rows of H * d before the
    transpose (`reshape(-1, H * d)` or `reshape(B, S, -1)`)."""

    def __init__(self, heads, d_k, style):
        super().__init__()
        self.heads, self.d_k, self.style = heads, d_k, style
        self.qkv = nn.Linear(heads * d_k, 3 * heads * d_k)

    def forward(self, x):
        B, S, _ = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, self.d_k).permute(2, 0, 3, 1, 4)
        context = F.scaled_dot_product_attention(q, k, v)  # [B, H, S, d_k]
        if self.style == "rows":
            return context.reshape(-1, self.heads * self.d_k)
        return context.reshape(B, S, -1)


@sizes
@pytest.mark.parametrize("style", ["rows", "tokens"])
def test_heads_merged_before_the_transpose_are_still_found(size, style):
    batch, heads, seq, d_k = size
    found = findings(MergeBeforeTranspose(heads, d_k, style), torch.randn(batch, seq, heads * d_k))
    first = only(found, "view_mixes_axes")
    assert "transpose" in first.hint, first.message


# -- F2, F7: positions regrouped among themselves, or folded into the batch ------------------
class RelativeShift(nn.Module):
    """Transformer-XL's relative shift of [B, H, Q, K] position scores: viewed as [.., K, Q],
    a row dropped, viewed back (XLNet's `x_size` indexing, or the unpacked spelling)."""

    def __init__(self, heads, d_k, style):
        super().__init__()
        self.heads, self.d_k, self.style = heads, d_k, style
        self.q = nn.Linear(heads * d_k, heads * d_k)
        self.r = nn.Linear(heads * d_k, heads * d_k)
        self.pos = nn.Embedding(256, heads * d_k)

    def forward(self, x):
        B, S, _ = x.shape
        q = self.q(x).view(B, S, self.heads, self.d_k).transpose(1, 2)
        r = self.r(self.pos(torch.arange(2 * S))).view(2 * S, self.heads, self.d_k)
        if self.style == "x_size":
            bd = torch.einsum("bnid,jnd->bnij", q, r)
            x_size = bd.shape
            bd = bd.reshape(x_size[0], x_size[1], x_size[3], x_size[2])
            bd = bd[:, :, 1:, :]
            bd = bd.reshape(x_size[0], x_size[1], x_size[2], x_size[3] - 1)
        else:
            bd = q @ r.permute(1, 2, 0)  # [B, H, Q, K]
            b, h, n_q, n_k = bd.shape
            bd = bd.reshape(b, h, n_k, n_q)[:, :, 1:].reshape(b, h, n_q, n_k - 1)
        return bd[..., :S].softmax(-1)


@sizes
@pytest.mark.parametrize("style", ["x_size", "unpacked"])
def test_the_relative_shift_is_silent(size, style):
    batch, heads, seq, d_k = size
    silent(RelativeShift(heads, d_k, style), torch.randn(batch, seq, heads * d_k))


class Chunks(nn.Module):
    """A chunked scan: the sequence cut into chunks of `chunk`, kept as an axis or folded
    into the batch."""

    def __init__(self, width, style, chunk=4):
        super().__init__()
        self.style, self.chunk = style, chunk
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        B, S, D = x.shape
        h = self.proj(x)
        if self.style == "split":
            return h.view(B, S // self.chunk, self.chunk, D).cumsum(2)
        return h.reshape(B * (S // self.chunk), self.chunk, D).cumsum(1)


@sizes
@pytest.mark.parametrize("style", ["split", "fold_into_batch"])
def test_chunks_of_a_sequence_are_silent(size, style):
    batch, heads, seq, d_k = size
    silent(Chunks(heads * d_k, style), torch.randn(batch, 4 * seq, heads * d_k))


class Windows(nn.Module):
    """Swin's and segment-anything's window_partition on a conv's channels-last patches,
    with its permute (views, or einops); `bug` drops the permute."""

    def __init__(self, width, window, style="view", bug=False):
        super().__init__()
        self.window, self.style, self.bug = window, style, bug
        self.patch_embed = nn.Conv2d(3, width, kernel_size=2, stride=2)
        self.qkv = nn.Linear(width, 3 * width)

    def forward(self, image):
        x = self.patch_embed(image).permute(0, 2, 3, 1)  # [B, H, W, C]
        B, H, W, C = x.shape
        ws = self.window
        if self.style == "einops":
            windows = rearrange(x, "b (h p) (w q) c -> (b h w) p q c", p=ws, q=ws)
        else:
            x = x.view(B, H // ws, ws, W // ws, ws, C)
            if self.bug:
                windows = x.contiguous().view(-1, ws, ws, C)
            else:
                windows = x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, ws, ws, C)
        return self.qkv(windows.view(-1, ws * ws, C))


@sizes
@pytest.mark.parametrize("style", ["view", "einops"])
def test_a_window_partition_with_its_permute_is_silent(size, style):
    batch, heads, seq, d_k = size
    silent(Windows(heads * d_k, 4, style), torch.randn(batch, 3, 32, 16))


@sizes
def test_a_window_partition_without_its_permute_gets_the_permute_hint(size):
    """segment-anything's window_partition with its permute removed: each window then
    takes rows of the grid. The hint is the permute, not a patch embedding."""
    batch, heads, seq, d_k = size
    found = findings(Windows(heads * d_k, 4, bug=True), torch.randn(batch, 3, 32, 16))
    first = only(found, "view_mixes_axes")
    assert first.message.splitlines()[0].endswith(
        "each window takes rows of pixels, not a square of them"
    )
    assert first.hint == (
        "a view keeps memory order, so windows of [B, H, W, C] need the window grid moved next "
        "to the batch first: x.view(B, H // w, w, W // w, w, C).permute(0, 1, 3, 2, 4, 5)"
        ".reshape(-1, w, w, C)"
    )


class MobileViTUnfold(nn.Module):
    """MobileViT's unfolding of [B, C, H, W] into patches: the rows of the patch grid folded
    with the batch and the channels, then transposed (`conv=False`: a raw image)."""

    def __init__(self, channels, patch=2, conv=True):
        super().__init__()
        self.patch = patch
        self.conv = nn.Conv2d(3, channels, 3, padding=1) if conv else None
        self.proj = nn.Linear(channels if conv else 3, channels)

    def forward(self, image):
        features = self.conv(image) if self.conv is not None else image
        p = self.patch
        batch_size, channels, orig_height, orig_width = features.shape
        num_patch_width, num_patch_height = orig_width // p, orig_height // p
        num_patches = num_patch_height * num_patch_width
        patches = features.reshape(batch_size * channels * num_patch_height, p, num_patch_width, p)
        patches = patches.transpose(1, 2)
        patches = patches.reshape(batch_size, channels, num_patches, p * p)
        patches = patches.transpose(1, 3)
        patches = patches.reshape(batch_size * p * p, num_patches, -1)
        return self.proj(patches)


@sizes
@pytest.mark.parametrize("conv", [True, False], ids=["conv", "image"])
def test_mobilevit_unfolding_is_silent(size, conv):
    batch, heads, seq, d_k = size
    silent(MobileViTUnfold(heads * d_k, conv=conv), torch.randn(batch, 3, 8, 12))


# -- F3: a name read where the code reads it ---------------------------------------------------
class NamesReassigned(nn.Module):
    """XGLM's attention: `src_len` is `tgt_len` at the key/value split and is assigned
    again, from the folded keys, further down (or unpacked again from their shape)."""

    def __init__(self, heads, d_k, style):
        super().__init__()
        self.num_heads, self.head_dim, self.style = heads, d_k, style
        width = heads * d_k
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(width, width) for _ in range(3))

    def forward(self, hidden_states):
        bsz, tgt_len, _ = hidden_states.size()
        src_len = tgt_len
        query_states = self.q_proj(hidden_states).view(bsz, tgt_len, -1, self.head_dim)
        key_states = (
            self.k_proj(hidden_states).view(bsz, src_len, -1, self.head_dim).transpose(1, 2)
        )
        value_states = (
            self.v_proj(hidden_states).view(bsz, src_len, -1, self.head_dim).transpose(1, 2)
        )
        proj_shape = (bsz * self.num_heads, -1, self.head_dim)
        query_states = query_states.transpose(1, 2).reshape(*proj_shape)
        key_states = key_states.reshape(*proj_shape)
        value_states = value_states.reshape(*proj_shape)
        if self.style == "assigned_later":
            src_len = key_states.size(1)
        else:
            _, src_len, _ = key_states.shape
        attn_weights = torch.bmm(query_states, key_states.transpose(1, 2)).softmax(-1)
        attn_output = torch.bmm(attn_weights, value_states)
        attn_output = attn_output.view(bsz, self.num_heads, tgt_len, self.head_dim)
        return attn_output.transpose(1, 2).reshape(bsz, tgt_len, -1), src_len


@sizes
@pytest.mark.parametrize("style", ["assigned_later", "unpacked_later"])
def test_a_name_reassigned_later_in_the_function_is_read_as_it_was(size, style):
    batch, heads, seq, d_k = size
    silent(NamesReassigned(heads, d_k, style), torch.randn(batch, seq, heads * d_k))


class CarveThroughAlias(nn.Module):
    """The heads carved out of the sequence, the sizes read through names: found where the
    names say so (the alias read before the view, not its later value)."""

    def __init__(self, heads, d_k):
        super().__init__()
        self.n_heads, self.d_k = heads, d_k
        self.W_q = nn.Linear(heads * d_k, heads * d_k)

    def forward(self, x):
        B, S, _ = x.shape
        length = S
        q = self.W_q(x).view(B, self.n_heads, length, self.d_k)
        length = 0
        return q, length


@sizes
def test_a_carve_through_an_alias_is_still_found(size):
    batch, heads, seq, d_k = size
    found = findings(CarveThroughAlias(heads, d_k), torch.randn(batch, seq, heads * d_k))
    first = only(found, "view_mixes_axes")
    assert "view(batch, seq, heads, d_k).transpose(1, 2)" in first.hint, first.message


# -- F5: a batch made by repeat ----------------------------------------------------------------
class RepeatedBias(nn.Module):
    """WavLM's relative-position bias, [H, T, T] from an embedding, repeated over the batch
    the code read (`repeat(bsz, 1, 1, 1)`, or `expand(bsz, ...)`) and folded as
    [bsz * heads, T, T] for bmm."""

    def __init__(self, heads, d_k, style):
        super().__init__()
        self.num_heads, self.style = heads, style
        self.rel_attn_embed = nn.Embedding(320, heads)
        self.q = nn.Linear(heads * d_k, heads * d_k)

    def forward(self, hidden_states):
        bsz, tgt_len, _ = hidden_states.size()
        pos = torch.arange(tgt_len)
        buckets = (pos[None, :] - pos[:, None]).clamp(-150, 150) + 150
        position_bias = self.rel_attn_embed(buckets).permute(2, 0, 1)  # [H, T, T]
        bias, T, h = position_bias, tgt_len, self.num_heads
        if self.style == "repeat":
            position_bias = bias.unsqueeze(0).repeat(bsz, 1, 1, 1).view(bsz * h, T, T)
        else:
            position_bias = bias.expand(bsz, -1, -1, -1).reshape(bsz * h, T, T)
        q = self.q(hidden_states).view(bsz, tgt_len, self.num_heads, -1).transpose(1, 2)
        q = q.reshape(bsz * self.num_heads, tgt_len, -1)
        return (torch.bmm(q, q.transpose(1, 2)) + position_bias).softmax(-1)


@sizes
@pytest.mark.parametrize("style", ["repeat", "expand"])
def test_a_batch_made_by_repeat_is_the_batch_the_code_read(size, style):
    batch, heads, seq, d_k = size
    silent(RepeatedBias(heads, d_k, style), torch.randn(batch, seq, heads * d_k))


# -- F6: the batch of a second input -------------------------------------------------------------
class SpeechAttention(nn.Module):
    """SpeechT5's attention: bmm on [bsz * heads, T, d], a relative-position bias computed
    with the queries' positions as the batch of a matmul ([T, bsz * heads, d] @ [T, d, T])."""

    def __init__(self, heads, d_k):
        super().__init__()
        self.num_heads, self.head_dim = heads, d_k
        width = heads * d_k
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(width, width) for _ in range(4)
        )

    def forward(self, hidden_states, key_value_states=None, position_bias=None):
        bsz, tgt_len, _ = hidden_states.size()
        query_states = self.q_proj(hidden_states) * self.head_dim**-0.5
        current = hidden_states if key_value_states is None else key_value_states
        key_states = self.k_proj(current).view(bsz, -1, self.num_heads, self.head_dim)
        value_states = self.v_proj(current).view(bsz, -1, self.num_heads, self.head_dim)
        proj_shape = (bsz * self.num_heads, -1, self.head_dim)
        query_states = query_states.view(bsz, tgt_len, self.num_heads, self.head_dim)
        query_states = query_states.transpose(1, 2).reshape(*proj_shape)
        key_states = key_states.transpose(1, 2).reshape(*proj_shape)
        value_states = value_states.transpose(1, 2).reshape(*proj_shape)
        attn_weights = torch.bmm(query_states, key_states.transpose(1, 2))
        if position_bias is not None:
            reshape_q = query_states.contiguous().view(bsz * self.num_heads, -1, self.head_dim)
            reshape_q = reshape_q.transpose(0, 1)
            rel_pos_bias = torch.matmul(reshape_q, position_bias.transpose(-2, -1))
            rel_pos_bias = rel_pos_bias.transpose(0, 1).view(
                bsz * self.num_heads, position_bias.size(0), position_bias.size(1)
            )
            attn_weights = attn_weights + rel_pos_bias
        attn_output = torch.bmm(attn_weights.softmax(-1), value_states)
        attn_output = attn_output.view(bsz, self.num_heads, tgt_len, self.head_dim)
        return self.out_proj(attn_output.transpose(1, 2).reshape(bsz, tgt_len, -1))


class SpeechToText(nn.Module):
    """An encoder over audio (features through a Linear, or raw samples through a conv
    stack) with SpeechT5's relative bias, and a text decoder whose cross-attention views
    the encoder's keys with its own `bsz`."""

    def __init__(self, heads, d_k, frontend):
        super().__init__()
        width = heads * d_k
        self.frontend = frontend
        self.features = nn.Linear(16, width)
        self.conv = nn.Conv1d(1, width, kernel_size=4, stride=4)
        self.pos_k = nn.Embedding(64, d_k)
        self.encoder = SpeechAttention(heads, d_k)
        self.embed = nn.Embedding(100, width)
        self.self_attn = SpeechAttention(heads, d_k)
        self.cross_attn = SpeechAttention(heads, d_k)

    def forward(self, input_values, decoder_input_ids):
        if self.frontend == "features":
            x = self.features(input_values)
        else:
            x = self.conv(input_values[:, None]).transpose(1, 2)
        seq = x.shape[1]
        pos = torch.arange(seq)
        position_bias = self.pos_k((pos[:, None] - pos[None, :]).clamp(-31, 32) + 31)
        memory = self.encoder(x, position_bias=position_bias)
        y = self.self_attn(self.embed(decoder_input_ids))
        return self.cross_attn(y, key_value_states=memory)


@sizes
@pytest.mark.parametrize("frontend", ["features", "raw_samples"])
def test_the_batch_of_an_audio_encoder_stays_the_batch(size, frontend):
    batch, heads, seq, d_k = size
    audio = (
        torch.randn(batch, seq + 3, 16)
        if frontend == "features"
        else torch.randn(batch, 4 * (seq + 3))
    )
    ids = torch.randint(0, 100, (batch, seq))
    silent(SpeechToText(heads, d_k, frontend), audio, ids)


@pytest.mark.parametrize("batch, seq", [(3, 7), (4, 4), (2, 16)], ids=list(SIZES))
def test_the_encoder_batch_of_led_stays_the_batch(batch, seq):
    """LED's encoder (Longformer's sliding chunks: its [batch * heads] axis padded by F.pad,
    an op that makes its axes anew) adds its output back onto the input: the input's batch
    keeps its kind, and the decoder's cross-attention view by its own `bsz` is silent."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LEDConfig(
        vocab_size=128,
        d_model=64,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=96,
        decoder_ffn_dim=96,
        max_encoder_position_embeddings=128,
        max_decoder_position_embeddings=128,
        attention_window=[4],
    )
    torch.manual_seed(0)
    model = transformers.LEDForConditionalGeneration(config).eval()
    ids = torch.randint(5, 120, (batch, seq))
    silent(model, input_ids=ids, decoder_input_ids=ids[:, :5])


# -- channels-last feature maps --------------------------------------------------------------------
class ChannelsLast(nn.Module):
    """[B, H, W, C] flattened to its H * W positions (`reshape(B, H * W, C)`, or
    `flatten(1, 2)`), a raw channels-last input or a conv's output permuted to it."""

    def __init__(self, channels, style, conv):
        super().__init__()
        self.style = style
        self.conv = nn.Conv2d(channels, channels, 1) if conv else None
        self.proj = nn.Linear(channels, channels)

    def forward(self, x):
        if self.conv is not None:
            x = self.conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        B, H, W, C = x.shape
        tokens = x.reshape(B, H * W, C) if self.style == "reshape" else x.flatten(1, 2)
        return self.proj(tokens)


@sizes
@pytest.mark.parametrize("style", ["reshape", "flatten"])
@pytest.mark.parametrize("conv", [False, True], ids=["input", "conv"])
def test_a_channels_last_map_flattened_to_positions_is_silent(size, style, conv):
    batch, heads, seq, d_k = size
    silent(ChannelsLast(heads * d_k, style, conv), torch.randn(batch, seq, seq + 1, heads * d_k))


# -- transformers' grouped-query decode (sdpa_attention.py's pack_gqa) -------------------------
class PackedGQA(nn.Module):
    """A decode step that runs SDPA on the kv heads with the query heads of each group as
    its rows ([B, H, 1, d] -> [B, kv, H / kv, d]) and unpacks the output, transformers
    5.25's `pack_gqa`; the fused [kv, group + 2, d] projection of Falcon applied with a
    matmul (`fused`), or separate nn.Linear projections."""

    def __init__(self, heads, kv_heads, d_k, fused):
        super().__init__()
        self.heads, self.kv_heads, self.d_k, self.fused = heads, kv_heads, d_k, fused
        width = heads * d_k
        if fused:
            self.query_key_value = Matmul(width, (heads + 2 * kv_heads) * d_k)
        else:
            self.q = nn.Linear(width, width)
            self.kv = nn.Linear(width, 2 * kv_heads * d_k)

    def forward(self, x, past_key, past_value):
        batch, q_length, _ = x.shape
        group = self.heads // self.kv_heads
        if self.fused:
            qkv = self.query_key_value(x).view(batch, q_length, self.kv_heads, group + 2, self.d_k)
            query = qkv[:, :, :, :-2].flatten(2, 3).transpose(1, 2)
            key = qkv[:, :, :, [-2]].flatten(2, 3).transpose(1, 2)
            value = qkv[:, :, :, [-1]].flatten(2, 3).transpose(1, 2)
        else:
            query = self.q(x).view(batch, q_length, self.heads, self.d_k).transpose(1, 2)
            key, value = self.kv(x).view(batch, q_length, 2, self.kv_heads, self.d_k).unbind(2)
            key, value = key.transpose(1, 2), value.transpose(1, 2)
        key = torch.cat([past_key, key], dim=2)
        value = torch.cat([past_value, value], dim=2)
        b, num_attention_heads, _, dim = query.shape
        query = query.reshape(b, num_attention_heads // group, group, dim)
        attn_output = F.scaled_dot_product_attention(query, key, value)
        attn_output = attn_output.reshape(attn_output.shape[0], -1, q_length, value.shape[-1])
        attn_output = attn_output.transpose(1, 2).contiguous()
        return attn_output.reshape(batch, q_length, -1)


@sizes
@pytest.mark.parametrize("fused", [True, False], ids=["fused_matmul", "linear"])
def test_a_grouped_query_decode_step_is_silent(size, fused):
    batch, heads, seq, d_k = size
    heads += heads % 2  # groups of two query heads per kv head
    kv_heads = heads // 2
    past = torch.randn(2, batch, kv_heads, seq, d_k)
    model = PackedGQA(heads, kv_heads, d_k, fused)
    silent(model, torch.randn(batch, 1, heads * d_k), past[0], past[1])


# -- hints that fit the code ------------------------------------------------------------------------
class NanoGPTSplit(nn.Module):
    """nanoGPT's attention with the key split written `view(B, nh, T, hs)`: torch refuses
    the view of a column slice of c_attn (except where the sizes let it run)."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head, self.n_embd = n_head, n_embd
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, self.n_head, T, C // self.n_head)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


@sizes
def test_a_heads_split_carved_from_the_sequence_gets_the_split_hint(size):
    """Never ".reshape(...)", which would run and carve the heads out of the sequence."""
    batch, heads, seq, d_k = size
    model, x = NanoGPTSplit(heads * d_k, heads), torch.randn(batch, seq, heads * d_k)
    expected = (
        "split heads out of the feature axis, then move them: use "
        f"k.view(batch, seq, heads, d_k).transpose(1, 2), i.e. view({batch}, {seq}, {heads}, "
        f"{d_k}).transpose(1, 2)"
    )
    if size == SIZES["coincident"]:  # the strides let the view run: a silent carve
        first = only(findings(model, x), "view_mixes_axes")
    else:
        with pytest.raises(ShapeError) as info:
            findings(model, x)
        first = info.value
        assert first.kind == "noncontiguous_view"
    assert first.hint == expected
    assert "reshape" not in first.hint


def test_a_view_after_transpose_keeps_the_reshape_hint():
    """A merge of whole neighbours after a transpose: .reshape is the fix."""
    model = MergeAfterTranspose()
    with pytest.raises(ShapeError) as info:
        findings(model, torch.randn(2, 5, 33))
    assert info.value.kind == "noncontiguous_view"
    assert info.value.hint == "use context.contiguous().view(...) or context.reshape(...)"


class MergeAfterTranspose(nn.Module):
    def __init__(self, heads=3, d_k=11):
        super().__init__()
        self.heads, self.d_k = heads, d_k
        self.qkv = nn.Linear(heads * d_k, 3 * heads * d_k)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, self.d_k).permute(2, 0, 3, 1, 4)
        attn = F.softmax(q @ k.transpose(-2, -1), dim=-1)
        context = (attn @ v).transpose(1, 2)  # [B, T, H, d_k], not contiguous
        return context.view(B, T, self.heads * self.d_k)


def precompute_freqs_cis(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    return torch.polar(torch.ones(end, dim // 2), torch.outer(torch.arange(end).float(), freqs))


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class LlamaAttention(nn.Module):
    """meta-llama's Attention: fairscale-style projections (a matmul on their own weight),
    rotary through complex numbers, a KV cache buffer; `bug` merges the heads without the
    transpose. The heads have no name after the complex rotary."""

    def __init__(self, dim, n_heads, max_batch=8, max_seq=128, bug=False):
        super().__init__()
        self.n_local_heads, self.head_dim, self.bug = n_heads, dim // n_heads, bug
        self.wq, self.wk, self.wv, self.wo = (Matmul(dim, dim) for _ in range(4))
        self.register_buffer("cache_k", torch.zeros(max_batch, max_seq, n_heads, dim // n_heads))
        self.register_buffer("cache_v", torch.zeros(max_batch, max_seq, n_heads, dim // n_heads))
        self.register_buffer("freqs_cis", precompute_freqs_cis(dim // n_heads, max_seq))

    def forward(self, x, start_pos=0):
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq = xq.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        freqs_cis = self.freqs_cis[start_pos : start_pos + seqlen]
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)
        self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk
        self.cache_v[:bsz, start_pos : start_pos + seqlen] = xv
        keys = self.cache_k[:bsz, : start_pos + seqlen]
        values = self.cache_v[:bsz, : start_pos + seqlen]
        xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, values)  # (bs, n_local_heads, seqlen, head_dim)
        if self.bug:
            output = output.contiguous().view(bsz, seqlen, -1)
        else:
            output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(output)


@sizes
def test_a_merge_without_its_transpose_gets_the_merge_hint(size):
    batch, heads, seq, d_k = size
    d_k += d_k % 2  # rotary pairs
    x = torch.randn(batch, seq, heads * d_k)
    silent(LlamaAttention(heads * d_k, heads), x)
    first = only(findings(LlamaAttention(heads * d_k, heads, bug=True), x), "view_mixes_axes")
    assert first.hint == (
        "transpose first: output.transpose(1, 2).contiguous().view(batch, seq, heads * d_k), "
        f"i.e. .transpose(1, 2).reshape({batch}, {seq}, {heads * d_k})"
    )


class ConvPatches(nn.Module):
    """DINOv2's patch embedding: a strided Conv2d, then `flatten(2).transpose(1, 2)`;
    `bug` flattens with `reshape(B, -1, C)` instead."""

    def __init__(self, width, patch=4, bug=False):
        super().__init__()
        self.proj = nn.Conv2d(3, width, kernel_size=patch, stride=patch)
        self.bug = bug

    def forward(self, x):
        x = self.proj(x)  # B C H W
        if self.bug:
            B, C, H, W = x.shape
            return x.reshape(B, -1, C)
        return x.flatten(2).transpose(1, 2)  # B HW C


@pytest.mark.parametrize(
    "width, side", [(33, 20), (16, 16), (512, 64)], ids=["distinct", "coincident", "realistic"]
)
def test_a_conv_patch_flatten_gets_the_flatten_hint(width, side):
    """The code already patchifies with Conv2d: the fix is the flatten, not a patch
    embedding (coincident: the channels as many as the patches)."""
    image = torch.randn(2, 3, side, side)
    silent(ConvPatches(width), image)
    first = only(findings(ConvPatches(width, bug=True), image), "view_mixes_axes")
    assert first.hint == (
        "a conv gives [batch, channels, height, width], the channels first: "
        "x.flatten(2).transpose(1, 2) makes [batch, height * width, channels]"
    )


# -- T1: ProphetNet's predict-stream unfold ----------------------------------------------------------
def test_prophetnet_mixing_is_described_within_each_example():
    """A real inconsistency of transformers (the predict stream's relative-position rows
    gathered in another order than they were folded), found as before; the batch is the
    outermost factor of both orders, so the message says the mixing is within each
    example."""
    transformers = pytest.importorskip("transformers")
    config = transformers.ProphetNetConfig(
        vocab_size=128,
        hidden_size=64,
        encoder_ffn_dim=96,
        decoder_ffn_dim=96,
        num_encoder_layers=1,
        num_decoder_layers=1,
        num_encoder_attention_heads=4,
        num_decoder_attention_heads=4,
        ngram=2,
    )
    torch.manual_seed(0)
    model = transformers.ProphetNetForConditionalGeneration(config).eval()
    ids = torch.randint(5, 120, (3, 7))
    found = findings(model, input_ids=ids, decoder_input_ids=ids[:, :5])
    first = only(found, "batch_mixing")
    relation = first.message.splitlines()[0]
    assert relation.startswith(
        "predict_relative_pos_embeddings.view(3, 2, 4, 5, -1): unfolds [batch"
    )
    assert "it cuts the 120 entries into 3 x 2 x 4 x 5, not into the 3 x 5 x 2 x 4" in relation
    assert relation.endswith(
        "weight] entries trade places ([batch] is the outermost factor in both orders: no "
        "example takes another's data)"
    )
    assert "so within each example the [seq" in relation
    assert "examples trade their data" not in relation
