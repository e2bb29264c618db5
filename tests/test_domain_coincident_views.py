"""Views and concatenations that the domain zoo's diffusion models get wrong where sizes
coincide (batch == tokens == heads == d_k): found by axis provenance and the user's own
sizes, with the message that says what lands where; their correct counterparts, and the
concatenations that are right, stay silent at the three sizes."""

import warnings

import domain_zoo
import domain_zoo_measure as measuring
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import shapeguard
from shapeguard import ShapeWarning

pytestmark = pytest.mark.no_shapeguard  # the bugs warn on purpose

SIZES = {s.name: s for s in domain_zoo.SETTINGS}
COINCIDENT = SIZES["coincident"]


def traced(arch: str, bug: str | None, sizes=COINCIDENT) -> dict:
    return measuring.run_trace(*measuring.build(domain_zoo.ARCHS[arch], sizes, bug))


def only_finding(result: dict) -> dict:
    assert result["error"] is None, result["error"]
    kinds = [f["kind"] for f in result["findings"]]
    assert len(kinds) == 1, [f["message"] for f in result["findings"]]
    return result["findings"][0]


def findings(model: nn.Module, *inputs) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        with torch.no_grad():
            trace = shapeguard.trace(model, *inputs, mode="warn")
    return list(trace.findings)


# -- the bugs, at the coincident size -----------------------------------------------------
def test_tokens_reshaped_back_to_a_map_are_read_from_the_shape_the_code_kept():
    """`b, c, h, w = x.shape` of the conv map, then `x` rebound: `x_in = x` still holds the
    map, so h and w are its height and width, and the view puts channels there."""
    found = only_finding(traced("spatial", "spatial_out_reshape"))
    assert found["kind"] == "view_mixes_axes"
    assert domain_zoo.on_marked_line("spatial_out_reshape", found["location"])
    lines = found["message"].splitlines()
    assert lines[0] == (
        "x.reshape(4, 16, 2, 2): axis 2 is h (height) but receives part of channels (feature "
        "axis): a view keeps memory order, and only the coinciding sizes (2) let it run"
    )
    assert lines[-1] == (
        "  hint: a view keeps memory order and cannot move an axis: view the tensor in the "
        "order its axes are stored, then move them with permute (or transpose): "
        "x.view(4, 2, 2, 16).permute(0, 3, 1, 2)"
    )


def test_the_same_reshape_at_realistic_sizes_names_the_permute():
    found = only_finding(traced("spatial", "spatial_out_reshape", SIZES["realistic"]))
    assert "axis 2 is h (height) but receives part of channels" in found["message"]
    assert found["message"].endswith("x.view(4, 8, 8, 512).permute(0, 3, 1, 2)")


def test_unpatchify_without_its_permute_puts_the_tokens_where_channels_are_declared():
    found = only_finding(traced("dit", "dit_unpatchify"))
    assert found["kind"] == "view_mixes_axes"
    lines = found["message"].splitlines()
    assert lines[0] == (
        "x.reshape(4, 4, 4, 4): axis 1 is c (channels) but receives height*width (token "
        "axis): a view keeps memory order, and only the coinciding sizes (4) let it run"
    )
    assert lines[-1].endswith(
        "x.reshape(4, 2, 2, 2, 2, 4).permute(0, 5, 1, 3, 2, 4).reshape(4, 4, 4, 4)"
    )


@pytest.mark.parametrize("size", list(SIZES))
def test_the_unpatchify_hint_is_the_correct_unpatchify(size):
    """The hint's expression computes what DiT's einsum unpatchify does."""
    s = SIZES[size]
    gh, gw, p, c = *s.grid, s.patch, s.in_channels
    x = torch.randn(s.batch, gh * gw, p * p * c)
    want = torch.einsum("nhwpqc->nchpwq", x.reshape(s.batch, gh, gw, p, p, c))
    got = x.reshape(s.batch, gh, gw, p, p, c).permute(0, 5, 1, 3, 2, 4)
    image = (s.batch, c, gh * p, gw * p)
    assert torch.equal(got.reshape(image), want.reshape(image))
    message = only_finding(traced("dit", "dit_unpatchify", s))["message"]
    assert f".reshape({s.batch}, {gh}, {gw}, {p}, {p}, {c}).permute(0, 5, 1, 3, 2, 4)" in message


def test_joint_streams_concatenated_along_their_heads():
    result = traced("joint", "joint_cat_axis")
    assert result["error"] is None
    # One finding on each of the q, k and v cats (the three lines marked for the bug).
    locations = [f["location"] for f in result["findings"]]
    assert len(set(locations)) == 3
    assert all(domain_zoo.on_marked_line("joint_cat_axis", at) for at in locations)
    first = result["findings"][0]
    assert first["kind"] == "cat_axis"
    lines = first["message"].splitlines()
    assert lines[0] == (
        "torch.cat((qt, qi), dim=2) joins along heads (axis 2), but axis 1 holds seq in qt and "
        "height*width in qi: each position would hold the heads of two different tokens, and "
        "only the coinciding sizes (4) let it run"
    )
    assert lines[-1] == "  hint: concatenate along the tokens: torch.cat((qt, qi), dim=1)"


# -- the correct counterparts -------------------------------------------------------------
@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("arch", ["spatial", "dit", "joint"])
def test_the_correct_counterparts_are_silent(arch, size):
    result = traced(arch, None, SIZES[size])
    assert result["error"] is None and result["findings"] == [], result


class Streams(nn.Module):
    """Two token streams of d heads each, joined one of the right ways: `how` is "tokens"
    (text then image patches, SD3), "heads_same_tokens" (two heads groups of one input),
    "cache" (kept keys and new ones along the sequence) or "channels" (a map's channels
    next to a conditioning map's, as inpainting UNets stack latents and mask)."""

    def __init__(self, how: str, heads: int = 4, d_k: int = 4):
        super().__init__()
        self.how, self.heads, self.d_k = how, heads, d_k
        d = heads * d_k
        self.patches = nn.Conv2d(3, d, kernel_size=2, stride=2)
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)
        self.mix = nn.Conv2d(d + 3, d, 1)

    def split(self, t):
        B, L, _ = t.shape
        return t.view(B, L, self.heads, self.d_k)

    def forward(self, img, txt, past):
        grid = self.patches(img)
        x = grid.flatten(2).transpose(1, 2)  # [B, N, d]
        if self.how == "tokens":
            q = torch.cat((self.split(self.a(txt)), self.split(self.b(x))), dim=1)
        elif self.how == "heads_same_tokens":
            q = torch.cat((self.split(self.a(x)), self.split(self.b(x))), dim=2)
        elif self.how == "cache":
            q = torch.cat((past, self.split(self.b(x))), dim=1)
        else:
            cond = F.interpolate(img, size=grid.shape[-2:])
            return self.mix(torch.cat((grid, cond), dim=1))
        q = q.transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, q)


@pytest.mark.parametrize("how", ["tokens", "heads_same_tokens", "cache", "channels"])
def test_concatenations_that_are_right_are_silent(how):
    """At the size where every concatenation would run: 4 text tokens, 2 x 2 patches, 4
    cached positions, 4 heads of 4."""
    img, txt, past = torch.randn(4, 3, 4, 4), torch.randn(4, 4, 16), torch.randn(4, 4, 4, 4)
    assert findings(Streams(how), img, txt, past) == []


class PatchTokensCarved(nn.Module):
    """A ViT's patch tokens with heads carved out of them: `view(B, heads, N, d_k)`."""

    def __init__(self):
        super().__init__()
        self.n_heads = 4
        self.patches = nn.Conv2d(3, 64, kernel_size=4, stride=4)
        self.qkv = nn.Linear(64, 64)

    def forward(self, img):
        x = self.patches(img).flatten(2).transpose(1, 2)
        B, N, C = x.shape
        return self.qkv(x).view(B, self.n_heads, N, C // self.n_heads).softmax(-1)


def test_heads_carved_out_of_patch_tokens_keep_the_head_split_hint():
    """The way back to a map gets the permute hint; heads carved out of an image's tokens,
    with the module's head count leading the target, still get the head split."""
    (found,) = findings(PatchTokensCarved(), torch.randn(2, 3, 12, 20))
    assert found.hint == (
        "split heads out of the feature axis, then move them: use "
        "qkv(x).view(batch, seq, heads, d_k).transpose(1, 2)"
    )


class SpanConvMix(nn.Module):
    """ConvBERT's mixed attention: attention heads and span-convolution heads of the same
    tokens joined along the heads. The convolution reads each token's neighbours with
    F.unfold (stride 1, padded to keep the length), so its positions are the tokens'."""

    def __init__(self, heads: int, d_k: int, kernel: int = 3):
        super().__init__()
        self.heads, self.d_k, self.kernel = heads, d_k, kernel
        d = heads * d_k
        self.qkv, self.span, self.taps = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Linear(d, kernel)

    def forward(self, x):
        B, L, d = x.shape
        q, k, v = (
            t.view(B, L, self.heads, self.d_k).transpose(1, 2) for t in self.qkv(x).chunk(3, -1)
        )
        attended = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)  # [B, L, heads, d_k]
        near = F.unfold(
            self.span(x).transpose(1, 2).unsqueeze(-1),
            kernel_size=(self.kernel, 1),
            padding=((self.kernel - 1) // 2, 0),
        )  # [B, d * kernel, L]
        # Per token and head, a dynamic kernel over the neighbours, folded as ConvBERT folds it.
        near = near.transpose(1, 2).reshape(B, -1, d, self.kernel)
        near = near.reshape(-1, self.d_k, self.kernel)
        taps = self.taps(x).softmax(-1).unsqueeze(2).expand(-1, -1, self.heads, -1)
        taps = taps.reshape(-1, self.kernel, 1)
        conv = torch.matmul(near, taps).reshape(-1, d)
        conv = conv.reshape(B, -1, self.heads, self.d_k)
        return torch.cat([attended, conv], dim=2).reshape(B, L, 2 * d)


@pytest.mark.parametrize("size", list(SIZES))
def test_attention_and_span_convolution_heads_of_the_same_tokens_join_silently(size):
    """A same-padded, stride-1 unfold keeps the tokens' positions: the two heads groups
    hold the same tokens, and their concatenation along the heads is right."""
    s = SIZES[size]
    x = torch.randn(s.batch, s.seq, s.heads * s.d_k)
    assert findings(SpanConvMix(s.heads, s.d_k).eval(), x) == []


@pytest.mark.parametrize("size", list(SIZES))
def test_transformers_convbert_is_silent(size):
    """The world corpus' ConvBERT, whose mixed attention the model above follows."""
    transformers = pytest.importorskip("transformers")
    s = SIZES[size]
    config = transformers.ConvBertConfig(
        vocab_size=50,
        hidden_size=2 * s.heads * s.d_k,
        embedding_size=2 * s.heads * s.d_k,
        num_attention_heads=2 * s.heads,
        head_ratio=2,
        num_hidden_layers=1,
        intermediate_size=32,
    )
    model = transformers.ConvBertModel(config).eval()
    assert findings(model, torch.randint(0, 50, (s.batch, s.seq))) == []


@pytest.mark.parametrize("size", list(SIZES))
def test_a_heads_merge_in_the_window_attention_is_one_finding_not_two(size):
    """The Swin block's window reverse handles what its attention scrambled: a finding there
    (it used to come with a patchify hint) would be the merge bug again, at a correct line."""
    found = only_finding(traced("swin", "swin_merge", SIZES[size]))
    assert found["kind"] == "view_mixes_axes"
    assert domain_zoo.on_marked_line("swin_merge", found["location"])
    assert "merges heads back before moving them next to d_k" in found["message"]
