"""Causal intent from the model beyond the attention module's own `is_causal` (issue 28):
a config's `is_decoder` / `is_causal`, and a triangle at a sibling layer (another site of
the same module class in the same list of layers, earlier in the forward). Each bug is
found from the trace alone at the three size settings; encoders, encoder-decoders
(cross-attention of the same class), decode steps, a prefix-LM and bidirectional image
tokens stay silent.
"""

import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

import shapeguard
from shapeguard import ShapeWarning

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.no_shapeguard  # these tests read the traces they open


@dataclasses.dataclass(frozen=True)
class Sizes:
    name: str
    batch: int
    heads: int
    seq: int
    d_k: int


SETTINGS = (
    Sizes("distinct", 3, 4, 7, 16),
    Sizes("coincident", 4, 4, 4, 4),
    Sizes("realistic", 4, 8, 64, 64),
)
SETTING = pytest.mark.parametrize("sizes", SETTINGS, ids=lambda s: s.name)
VOCAB = 50


class Attention(nn.Module):
    """Self-attention (or, given `memory`, cross-attention) that says nothing of causality."""

    def __init__(self, d_model: int, heads: int, config=None) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d_model, d_model)
        self.kv = nn.Linear(d_model, 2 * d_model)
        if config is not None:
            self.config = config

    def forward(self, x, keep=None, memory=None):
        B, T, C = x.shape  # noqa: N806
        source = x if memory is None else memory
        S = source.shape[1]  # noqa: N806
        q = self.q(x).view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k, v = self.kv(source).view(B, S, 2, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return out.transpose(1, 2).reshape(B, T, C)


class Decoder(nn.Module):
    """Token embeddings and a list of attention layers; `masked` says which layers get the
    mask `keep(T)` builds (a triangle unless given)."""

    def __init__(self, s: Sizes, layers: int = 3, masked=None, keep=None, config=None):
        super().__init__()
        d_model = s.heads * s.d_k
        self.embed = nn.Embedding(VOCAB, d_model)
        self.layers = nn.ModuleList(Attention(d_model, s.heads, config) for _ in range(layers))
        self.masked = masked if masked is not None else range(layers)
        self.keep = keep or (lambda n: torch.ones(n, n, dtype=torch.bool).tril())

    def forward(self, input_ids, token_type_ids=None):
        x = self.embed(input_ids)
        keep = self.keep(input_ids.shape[1])
        for i, layer in enumerate(self.layers):
            x = x + layer(x, keep if i in self.masked else None)
        return x


def ids(s: Sizes, seq: int | None = None):
    torch.manual_seed(0)
    return torch.randint(0, VOCAB, (s.batch, s.seq if seq is None else seq))


def traced(model, *args, **kwargs):
    with shapeguard.trace(mode="warn") as trace, warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        model.eval()(*args, **kwargs)
    return trace


# -- a triangle at a sibling layer ---------------------------------------------------------------
@SETTING
def test_a_layer_that_lost_the_triangle_its_siblings_have_is_found(sizes):
    trace = traced(Decoder(sizes, masked={0}), ids(sizes))
    found = [f for f in trace.findings if f.kind == "reach_future"]
    assert [f.module.split()[0] for f in found] == ["layers.1", "layers.2"]
    first = found[0]
    assert first.op == "scaled_dot_product_attention"
    assert first.relation.startswith(
        # (no provenance names the heads axis of this hand-written model: its size alone)
        f"scaled_dot_product_attention over [batch={sizes.batch}, {sizes.heads}, "
        f"seq_q={sizes.seq}, seq_k={sizes.seq}]: {sizes.batch * sizes.heads * (sizes.seq - 1)} "
        f"of {sizes.batch * sizes.heads * sizes.seq} real query rows see later positions"
    )
    assert first.relation.endswith(
        "the site is causal: layers.0, another Attention at layers.* in this forward, sees no "
        "later position (its reach is causal)"
    )
    assert "hint:" in first.message


@SETTING
def test_layers_that_agree_are_silent(sizes):
    assert traced(Decoder(sizes), ids(sizes)).findings == []  # every layer causal
    assert traced(Decoder(sizes, masked=()), ids(sizes)).findings == []  # an encoder


def test_a_decode_step_is_no_evidence_and_is_not_judged():
    s = SETTINGS[0]
    # One query: the last position sees every key, and there is no later key to hide.
    assert traced(Decoder(s, masked={0}), ids(s, seq=1)).findings == []


def test_the_first_layer_is_judged_on_nothing_earlier():
    # The triangle is at layer 1 only: layer 0 ran before any evidence (a miss, not a guess).
    s = SETTINGS[0]
    assert traced(Decoder(s, layers=2, masked={1}), ids(s)).findings == []


@SETTING
def test_a_prefix_lm_whose_every_layer_sees_its_prefix_is_silent(sizes):
    prefix = 2

    def keep(n):
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        mask[:, :prefix] = True
        return mask

    assert traced(Decoder(sizes, keep=keep), ids(sizes)).findings == []


@SETTING
def test_image_tokens_that_see_each_other_in_a_later_layer_are_excused(sizes):
    # Gemma 3 / PaliGemma: image tokens attend bidirectionally; the model takes
    # token_type_ids, which say some spans see later tokens on purpose.
    def keep_images(n):
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        mask[:3, :3] = True  # positions 0..2 are one image
        return mask

    class Mixed(Decoder):
        def forward(self, input_ids, token_type_ids=None):
            x = self.embed(input_ids)
            n = input_ids.shape[1]
            x = x + self.layers[0](x, torch.ones(n, n, dtype=torch.bool).tril())
            for layer in self.layers[1:]:
                x = x + layer(x, keep_images(n))
            return x

    types = torch.zeros(sizes.batch, sizes.seq, dtype=torch.long)
    types[:, :3] = 1
    trace = traced(Mixed(sizes), ids(sizes), token_type_ids=types)
    assert trace.findings == []
    # Without the input that says so, the image span is a later position seen.
    trace = traced(Mixed(sizes), ids(sizes))
    assert {f.kind for f in trace.findings} == {"reach_future"}


class EncoderDecoder(nn.Module):
    """An encoder and a decoder of one attention class, and cross-attention of it too."""

    def __init__(self, s: Sizes, layers: int = 2) -> None:
        super().__init__()
        d_model = s.heads * s.d_k
        self.embed = nn.Embedding(VOCAB, d_model)
        self.encoder = nn.ModuleList(Attention(d_model, s.heads) for _ in range(layers))
        self.decoder = nn.ModuleList(Attention(d_model, s.heads) for _ in range(layers))
        self.cross = nn.ModuleList(Attention(d_model, s.heads) for _ in range(layers))

    def forward(self, input_ids, decoder_input_ids):
        memory = self.embed(input_ids)
        for layer in self.encoder:
            memory = memory + layer(memory)
        x = self.embed(decoder_input_ids)
        n = x.shape[1]
        keep = torch.ones(n, n, dtype=torch.bool).tril()
        for self_attn, cross in zip(self.decoder, self.cross, strict=True):
            x = x + self_attn(x, keep)
            x = x + cross(x, memory=memory)
        return x


@SETTING
def test_an_encoder_decoder_of_one_attention_class_is_silent(sizes):
    model = EncoderDecoder(sizes).eval()
    tokens = ids(sizes)
    with shapeguard.trace(mode="warn") as trace:
        model(tokens, tokens)  # the decoder reads the same tokens the encoder does
        model(tokens, tokens)  # a second forward: its encoder runs after a decoder
    assert trace.findings == []


# -- a config's flags ----------------------------------------------------------------------------
@SETTING
def test_a_decoder_config_without_a_triangle_is_found(sizes):
    config = transformers.PretrainedConfig(is_decoder=True)
    trace = traced(Decoder(sizes, masked=(), config=config), ids(sizes))
    found = [f for f in trace.findings if f.kind == "reach_future"]
    assert [f.module.split()[0] for f in found] == ["layers.0", "layers.1", "layers.2"]
    name = type(config).__name__  # PreTrainedConfig, as transformers spells it now
    assert found[0].relation.endswith(
        f"the site is causal: {name}.is_decoder is True (on Attention.config)"
    )


@SETTING
@pytest.mark.parametrize(
    "flags",
    [{"is_decoder": False}, {"is_decoder": True, "is_encoder_decoder": True}],
    ids=["encoder", "encoder_decoder"],
)
def test_configs_that_do_not_say_which_site_is_causal_are_silent(sizes, flags):
    config = transformers.PretrainedConfig(**flags)
    assert traced(Decoder(sizes, masked=(), config=config), ids(sizes)).findings == []


def test_a_module_that_says_it_is_not_causal_outranks_its_config():
    s = SETTINGS[0]
    model = Decoder(s, masked=(), config=transformers.PretrainedConfig(is_decoder=True))
    for layer in model.layers:
        layer.is_causal = False
    assert traced(model, ids(s)).findings == []
