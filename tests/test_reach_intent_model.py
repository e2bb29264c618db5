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
from jaxtyping import Float
from torch import Tensor, nn

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


# -- reach_other_example: a query that sees a key of another example -------------------------------
class PackedByReshape(nn.Module):
    """Examples packed back to back into one sequence, attended with no block mask (`block`:
    the document mask that makes it correct)."""

    def __init__(self, s: Sizes, block: bool = False) -> None:
        super().__init__()
        self.heads, self.block = s.heads, block
        self.qkv = nn.Linear(s.heads * s.d_k, 3 * s.heads * s.d_k)

    @shapeguard.contract
    def forward(self, x: Float[Tensor, "batch seq d_model"]):
        B, T, C = x.shape  # noqa: N806
        packed = x.reshape(1, B * T, C)  # one row of B * T tokens
        q, k, v = self.qkv(packed).view(1, B * T, 3, self.heads, C // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        keep = None
        if self.block:
            example = torch.arange(B).repeat_interleave(T)
            keep = example[:, None] == example[None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return out.transpose(1, 2).reshape(B, T, C)


class SeqFirstView(nn.Module):
    """Code written for [seq, batch, d_model] handed [batch, seq, d_model] (`transpose`: the
    caller's fix): its flattened batch*heads bmm attends across examples."""

    def __init__(self, s: Sizes, transpose: bool = False) -> None:
        super().__init__()
        self.heads, self.transpose = s.heads, transpose
        self.qkv = nn.Linear(s.heads * s.d_k, 3 * s.heads * s.d_k)

    @shapeguard.contract
    def forward(self, x: Float[Tensor, "batch seq d_model"]):
        if self.transpose:
            x = x.transpose(0, 1)
        T, B, C = x.shape  # noqa: N806 (read as [seq, batch, d_model])
        d = C // self.heads
        q, k, v = (
            t.reshape(T, B * self.heads, d).transpose(0, 1) for t in self.qkv(x).chunk(3, -1)
        )
        scores = torch.bmm(q, k.transpose(1, 2)) / d**0.5  # [B * heads, T, T] as it reads
        out = torch.bmm(scores.softmax(-1), v)
        return out.transpose(0, 1).reshape(T, B, C)


class EinsumOverBatch(nn.Module):
    """Scores over examples at each position; the attention product contracts over the batch
    (`right`: the per-example subscripts)."""

    def __init__(self, s: Sizes, right: bool = False) -> None:
        super().__init__()
        self.right = right
        self.qkv = nn.Linear(s.heads * s.d_k, 3 * s.heads * s.d_k)

    @shapeguard.contract
    def forward(self, x: Float[Tensor, "batch seq d_model"]):
        q, k, v = self.qkv(x).chunk(3, -1)
        if self.right:
            scores = torch.einsum("bqc,bkc->bqk", q, k)
            return torch.einsum("bqk,bkc->bqc", scores.softmax(-1), v)
        scores = torch.einsum("itc,jtc->tij", q, k)  # at each position, example i against j
        return torch.einsum("tij,jtc->itc", scores.softmax(-1), v)


def crossing(trace):
    return [f for f in trace.findings if f.kind == "reach_other_example"]


def embeddings(s: Sizes):
    torch.manual_seed(0)
    return torch.randn(s.batch, s.seq, s.heads * s.d_k)


@SETTING
def test_examples_packed_by_reshape_without_a_block_mask_see_each_other(sizes):
    (found,) = crossing(traced(PackedByReshape(sizes), embeddings(sizes)))
    tokens = sizes.batch * sizes.seq
    assert found.op == "scaled_dot_product_attention"
    assert found.relation.startswith(
        f"scaled_dot_product_attention over [1, {sizes.heads}, seq_q={tokens}, seq_k={tokens}]: "
        f"{tokens} of {tokens} query rows see keys of another example (first at query 0, of "
        f"example 0: it sees keys {sizes.seq}..{tokens - 1} of example 1)"
    )
    assert found.relation.endswith("the keys' axis carries the batch, named batch by a contract")
    assert "block-diagonal mask" in found.message
    assert crossing(traced(PackedByReshape(sizes, block=True), embeddings(sizes))) == []


@SETTING
def test_a_seq_first_view_of_a_batch_first_input_attends_across_examples(sizes):
    (found,) = crossing(traced(SeqFirstView(sizes), embeddings(sizes)))
    assert found.op == "softmax"
    assert f"seq_q={sizes.batch}, seq_k={sizes.batch}]" in found.relation
    assert "(first at query 0, of example 0: it sees keys 1.." in found.relation
    assert crossing(traced(SeqFirstView(sizes, transpose=True), embeddings(sizes))) == []


@SETTING
def test_an_einsum_that_contracts_over_the_batch_is_found(sizes):
    (found,) = crossing(traced(EinsumOverBatch(sizes), embeddings(sizes)))
    assert found.op == "softmax"
    assert found.relation.startswith(
        f"softmax over [{sizes.seq}, seq_q={sizes.batch}, seq_k={sizes.batch}]: "
        f"{sizes.batch} of {sizes.batch} query rows see keys of another example (first at "
        f"query 0, of example 0: it sees keys 1..{sizes.batch - 1} of example 1)"
    )
    assert crossing(traced(EinsumOverBatch(sizes, right=True), embeddings(sizes))) == []


def test_a_batch_known_only_by_convention_is_no_evidence():
    # The same bug, its input not annotated: the input's first axis is batch only by the
    # usual layout, so nothing is claimed.
    s = SETTINGS[0]

    class Unannotated(PackedByReshape):
        def forward(self, x):
            return PackedByReshape.forward.__wrapped__(self, x)

    assert crossing(traced(Unannotated(s), embeddings(s))) == []
