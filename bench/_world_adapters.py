"""Adapters: one small, correct model per use of a package, built the way its README shows.

Each `Adapter` builds a model at a `Sizes` (hidden = heads * head_dim) and makes its seeded
inputs for a padding layout (`n`, `l`, `r`; only where the model takes a mask). The imports
are inside the builders: a package that is not installed is reported, not fatal.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from _world_inputs import padding_mask
from torch import nn

VOCAB = 128


@dataclass(frozen=True)
class Adapter:
    label: str
    build: Callable  # (sizes) -> nn.Module
    inputs: Callable  # (sizes, padding, generator) -> (args, kwargs)
    paddings: tuple = ("n",)
    sizes: tuple = ("d", "c", "a", "r")
    # What its tokens are: the report counts the probes that held per non-text block.
    modality: str = "text"


def _ids(s, g, seq=None):
    return torch.randint(3, VOCAB, (s.batch, seq or s.seq), generator=g)


def _x(s, g, seq=None, batch=None):
    return torch.randn(batch or s.batch, seq or s.seq, s.hidden, generator=g)


def _keep(s, padding, seq=None):
    """Bool [batch, seq], True where a token is (the lucidrains packages' `mask`)."""
    mask = padding_mask(s.batch, seq or s.seq, padding)
    return None if mask is None else mask.bool()


def _with(kwargs, **extra):
    return {**kwargs, **{k: v for k, v in extra.items() if v is not None}}


# -- torch.nn --------------------------------------------------------------------------
def _mha(batch_first):
    def build(s):
        return nn.MultiheadAttention(s.hidden, s.heads, batch_first=batch_first)

    def inputs(s, padding, g):
        x = _x(s, g) if batch_first else _x(s, g).transpose(0, 1).contiguous()
        keep = _keep(s, padding)
        return (x, x, x), _with({}, key_padding_mask=None if keep is None else ~keep)

    return Adapter(
        f"nn.MultiheadAttention(batch_first={batch_first})", build, inputs, ("n", "l", "r")
    )


def _encoder():
    def build(s):
        layer = nn.TransformerEncoderLayer(s.hidden, s.heads, 96, dropout=0.0, batch_first=True)
        return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def inputs(s, padding, g):
        keep = _keep(s, padding)
        return (_x(s, g),), _with({}, src_key_padding_mask=None if keep is None else ~keep)

    return Adapter("nn.TransformerEncoder(batch_first=True)", build, inputs, ("n", "l", "r"))


def _transformer():
    def build(s):
        return nn.Transformer(s.hidden, s.heads, 2, 2, 96, dropout=0.0)  # sequence first

    def inputs(s, padding, g):
        src = _x(s, g).transpose(0, 1).contiguous()
        tgt = _x(s, g, seq=s.dec_seq).transpose(0, 1).contiguous()
        causal = nn.Transformer.generate_square_subsequent_mask(s.dec_seq)
        keep = _keep(s, padding)
        pad = None if keep is None else ~keep
        return (src, tgt), _with(
            {"tgt_mask": causal}, src_key_padding_mask=pad, memory_key_padding_mask=pad
        )

    return Adapter("nn.Transformer(batch_first=False)", build, inputs, ("n", "r"))


# -- x-transformers --------------------------------------------------------------------
def _xt_decoder():
    def build(s):
        from x_transformers import Decoder, TransformerWrapper

        layers = Decoder(dim=s.hidden, depth=2, heads=s.heads, attn_dim_head=s.head_dim,
                         attn_kv_heads=s.kv_heads, rotary_pos_emb=True,
            rotary_emb_dim=max(4, s.head_dim // 2))  # fmt: skip
        return TransformerWrapper(num_tokens=VOCAB, max_seq_len=128, attn_layers=layers)

    def inputs(s, padding, g):
        return (_ids(s, g),), _with({}, mask=_keep(s, padding))

    return Adapter("x_transformers Decoder (GQA, rotary)", build, inputs, ("n", "l", "r"))


def _xt_encoder():
    def build(s):
        from x_transformers import Encoder, TransformerWrapper

        layers = Encoder(dim=s.hidden, depth=2, heads=s.heads, attn_dim_head=s.head_dim)
        return TransformerWrapper(num_tokens=VOCAB, max_seq_len=128, attn_layers=layers)

    def inputs(s, padding, g):
        return (_ids(s, g),), _with({}, mask=_keep(s, padding))

    return Adapter("x_transformers Encoder", build, inputs, ("n", "r"))


def _xt_vit():
    def build(s):
        from x_transformers import Encoder, ViTransformerWrapper

        layers = Encoder(dim=s.hidden, depth=2, heads=s.heads, attn_dim_head=s.head_dim)
        return ViTransformerWrapper(image_size=32, patch_size=8, num_classes=10, attn_layers=layers)

    def inputs(s, padding, g):
        return (torch.randn(s.batch, 3, 32, 32, generator=g),), {}

    return Adapter("x_transformers ViTransformerWrapper", build, inputs, modality="image")


# -- lucidrains' attention variants ----------------------------------------------------
def _local_attention():
    def build(s):
        from local_attention import LocalAttention

        return LocalAttention(dim=s.head_dim, window_size=4, causal=True, look_backward=1,
                              look_forward=0, autopad=True)  # fmt: skip

    def inputs(s, padding, g):
        q, k, v = (torch.randn(s.batch, s.heads, s.seq, s.head_dim, generator=g) for _ in range(3))
        return (q, k, v), _with({}, mask=_keep(s, padding))

    return Adapter("local_attention LocalAttention", build, inputs, ("n", "r"))


def _local_transformer():
    def build(s):
        from local_attention import LocalTransformer

        return LocalTransformer(num_tokens=VOCAB, max_seq_len=128, dim=s.hidden, depth=2, heads=s.heads,
                                dim_head=s.head_dim, local_attn_window_size=4, causal=True)  # fmt: skip

    def inputs(s, padding, g):
        return (_ids(s, g),), {}

    return Adapter("local_attention LocalTransformer", build, inputs)


def _perceiver():
    def build(s):
        from perceiver_pytorch import Perceiver

        return Perceiver(input_channels=3, input_axis=2, num_freq_bands=4, max_freq=10.0, depth=2,
                         num_latents=16, latent_dim=s.hidden, cross_heads=1, latent_heads=s.heads,
                         cross_dim_head=s.head_dim, latent_dim_head=s.head_dim, num_classes=10)  # fmt: skip

    def inputs(s, padding, g):
        return (torch.randn(s.batch, 4, s.seq, 3, generator=g),), {}

    return Adapter("perceiver_pytorch Perceiver", build, inputs, modality="image")


def _perceiver_io():
    def build(s):
        from perceiver_pytorch import PerceiverIO

        return PerceiverIO(dim=s.hidden, queries_dim=s.hidden, logits_dim=10, depth=2, num_latents=16,
                           latent_dim=s.hidden, cross_heads=1, latent_heads=s.heads,
                           cross_dim_head=s.head_dim, latent_dim_head=s.head_dim)  # fmt: skip

    def inputs(s, padding, g):
        queries = torch.randn(s.batch, s.dec_seq, s.hidden, generator=g)
        return (_x(s, g),), _with({"queries": queries}, mask=_keep(s, padding))

    return Adapter("perceiver_pytorch PerceiverIO", build, inputs, ("n", "r"), modality="features")


def _nystrom():
    def build(s):
        from nystrom_attention import Nystromformer

        return Nystromformer(
            dim=s.hidden, dim_head=s.head_dim, heads=s.heads, depth=2, num_landmarks=4
        )

    def inputs(s, padding, g):
        return (_x(s, g),), _with({}, mask=_keep(s, padding))

    return Adapter("nystrom_attention Nystromformer", build, inputs, ("n", "r"))


def _linformer():
    def build(s):
        from linformer import LinformerLM

        return LinformerLM(num_tokens=VOCAB, dim=s.hidden, seq_len=s.seq, depth=2, heads=s.heads,
                           dim_head=s.head_dim, k=4)  # fmt: skip

    def inputs(s, padding, g):
        return (_ids(s, g),), {}

    return Adapter("linformer LinformerLM", build, inputs)


def _performer():
    def build(s):
        from performer_pytorch import PerformerLM

        return PerformerLM(num_tokens=VOCAB, max_seq_len=128, dim=s.hidden, depth=2, heads=s.heads,
                           dim_head=s.head_dim, causal=True, nb_features=16)  # fmt: skip

    def inputs(s, padding, g):
        return (_ids(s, g),), _with({}, mask=_keep(s, padding))

    return Adapter("performer_pytorch PerformerLM (causal)", build, inputs, ("n", "r"))


def _linear_attention():
    def build(s):
        from linear_attention_transformer import LinearAttentionTransformerLM

        return LinearAttentionTransformerLM(num_tokens=VOCAB, dim=s.hidden, heads=s.heads, depth=2,
                                            max_seq_len=128, dim_head=s.head_dim, causal=True)  # fmt: skip

    def inputs(s, padding, g):
        return (_ids(s, g),), _with({}, input_mask=_keep(s, padding))

    return Adapter(
        "linear_attention_transformer LinearAttentionTransformerLM (causal)",
        build,
        inputs,
        ("n", "r"),
    )


def _reformer():
    def build(s):
        from reformer_pytorch import Autopadder, ReformerLM

        return Autopadder(ReformerLM(num_tokens=VOCAB, dim=s.hidden, depth=2, max_seq_len=128, heads=s.heads,
                                     dim_head=s.head_dim, bucket_size=4, n_hashes=2, causal=True))  # fmt: skip

    def inputs(s, padding, g):
        return (_ids(s, g),), _with({}, input_mask=_keep(s, padding))

    return Adapter("reformer_pytorch ReformerLM (Autopadder)", build, inputs, ("n", "r"))


def _memory_efficient():
    def build(s):
        from memory_efficient_attention_pytorch import Attention

        return Attention(dim=s.hidden, dim_head=s.head_dim, heads=s.heads, causal=True,
                         memory_efficient=True, q_bucket_size=4, k_bucket_size=4)  # fmt: skip

    def inputs(s, padding, g):
        return (_x(s, g),), _with({}, mask=_keep(s, padding))

    return Adapter("memory_efficient_attention_pytorch Attention", build, inputs, ("n", "r"))


def _conformer():
    def build(s):
        from conformer import ConformerBlock

        return ConformerBlock(dim=s.hidden, dim_head=s.head_dim, heads=s.heads, ff_mult=2,
                              conv_expansion_factor=2, conv_kernel_size=7)  # fmt: skip

    def inputs(s, padding, g):
        return (_x(s, g),), _with({}, mask=_keep(s, padding))

    return Adapter("conformer ConformerBlock", build, inputs, ("n", "r"), modality="audio")


def _rotary():
    """The README's use: rotate queries and keys, then attention (here torch's sdpa)."""

    class RotaryAttention(nn.Module):
        def __init__(self, dim, heads):
            from rotary_embedding_torch import RotaryEmbedding

            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(dim, 3 * dim)
            self.out = nn.Linear(dim, dim)
            self.rotary = RotaryEmbedding(dim=max(4, dim // heads // 2))

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in (q, k, v))
            q, k = self.rotary.rotate_queries_or_keys(q), self.rotary.rotate_queries_or_keys(k)
            out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(out.transpose(1, 2).reshape(b, n, -1))

    def inputs(s, padding, g):
        return (_x(s, g),), {}

    return Adapter(
        "rotary_embedding_torch RotaryEmbedding in causal attention",
        lambda s: RotaryAttention(s.hidden, s.heads),
        inputs,
    )


def _einops_attention():
    """Multi-head attention written with einops as its documentation writes it: one
    projection split by `rearrange`, `einops.einsum` for both products, a key padding mask."""

    class EinopsAttention(nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.heads, self.scale = heads, (dim // heads) ** -0.5
            self.qkv = nn.Linear(dim, 3 * dim, bias=False)
            self.out = nn.Linear(dim, dim)

        def forward(self, x, mask=None):
            from einops import einsum, rearrange

            q, k, v = rearrange(
                self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.heads
            )
            dots = einsum(q, k, "b h i d, b h j d -> b h i j") * self.scale
            if mask is not None:
                dots = dots.masked_fill(~rearrange(mask, "b j -> b 1 1 j"), float("-inf"))
            attn = dots.softmax(dim=-1)
            out = einsum(attn, v, "b h i j, b h j d -> b h i d")
            return self.out(rearrange(out, "b h n d -> b n (h d)"))

    def inputs(s, padding, g):
        return (_x(s, g),), _with({}, mask=_keep(s, padding))

    return Adapter(
        "einops attention (rearrange, einsum)",
        lambda s: EinopsAttention(s.hidden, s.heads),
        inputs,
        ("n", "l", "r"),
    )


# -- diffusers ---------------------------------------------------------------------------
def _diffusers_attention():
    def build(s):
        from diffusers.models.attention_processor import Attention

        return Attention(
            query_dim=s.hidden, cross_attention_dim=32, heads=s.heads, dim_head=s.head_dim
        )

    def inputs(s, padding, g):
        context = torch.randn(s.batch, s.dec_seq, 32, generator=g)
        return (_x(s, g),), {"encoder_hidden_states": context}

    return Adapter("diffusers Attention (cross)", build, inputs, modality="image")


def _diffusers_block():
    def build(s):
        from diffusers.models.attention import BasicTransformerBlock

        return BasicTransformerBlock(s.hidden, s.heads, s.head_dim, cross_attention_dim=32)

    def inputs(s, padding, g):
        context = torch.randn(s.batch, s.dec_seq, 32, generator=g)
        return (_x(s, g),), {"encoder_hidden_states": context}

    return Adapter("diffusers BasicTransformerBlock", build, inputs, modality="image")


def _diffusers_2d():
    def build(s):
        from diffusers.models import Transformer2DModel

        return Transformer2DModel(num_attention_heads=s.heads, attention_head_dim=s.head_dim, in_channels=32,
                                  norm_num_groups=8, cross_attention_dim=32, num_layers=1)  # fmt: skip

    def inputs(s, padding, g):
        side = max(2, int(math.isqrt(s.seq)))
        image = torch.randn(s.batch, 32, side, side + 1, generator=g)
        context = torch.randn(s.batch, s.dec_seq, 32, generator=g)
        return (image,), {"encoder_hidden_states": context}

    return Adapter("diffusers Transformer2DModel", build, inputs, modality="image")


# -- torch_geometric ---------------------------------------------------------------------
def _graph(s, g):
    nodes = s.batch * s.seq
    edges = torch.randint(0, nodes, (2, 3 * nodes), generator=g)
    return torch.randn(nodes, s.hidden, generator=g), edges


def _graph_inputs(s, padding, g):
    return _graph(s, g), {}


def _gat():
    def build(s):
        from torch_geometric.nn import GATConv

        return GATConv(s.hidden, s.head_dim, heads=s.heads)

    return Adapter("torch_geometric GATConv", build, _graph_inputs, modality="graph")


def _transformer_conv():
    def build(s):
        from torch_geometric.nn import TransformerConv

        return TransformerConv(s.hidden, s.head_dim, heads=s.heads)

    return Adapter("torch_geometric TransformerConv", build, _graph_inputs, modality="graph")


# -- fair-esm, openai-whisper ------------------------------------------------------------
def _esm2():
    def build(s):
        import esm

        alphabet = esm.data.Alphabet.from_architecture("ESM-1b")
        return esm.model.esm2.ESM2(
            num_layers=2, embed_dim=s.hidden, attention_heads=s.heads, alphabet=alphabet
        )

    def inputs(s, padding, g):
        import esm

        alphabet = esm.data.Alphabet.from_architecture("ESM-1b")
        tokens = torch.randint(4, 24, (s.batch, s.seq), generator=g)  # amino acids
        tokens[:, 0] = alphabet.cls_idx
        mask = padding_mask(s.batch, s.seq, padding)
        if mask is not None:
            tokens = tokens.masked_fill(mask == 0, alphabet.padding_idx)
        return (tokens,), {}

    return Adapter("esm ESM2", build, inputs, ("n", "r"), modality="protein")


def _whisper():
    def build(s):
        from whisper.model import ModelDimensions, Whisper

        dims = ModelDimensions(n_mels=16, n_audio_ctx=s.seq, n_audio_state=s.hidden, n_audio_head=s.heads,
                               n_audio_layer=2, n_vocab=VOCAB, n_text_ctx=32, n_text_state=s.hidden,
                               n_text_head=s.heads, n_text_layer=2)  # fmt: skip
        model = Whisper(dims)
        # The text positions are torch.empty (a checkpoint fills them): filled here, as a
        # checkpoint would, so the outputs are finite and the probes can compare them.
        nn.init.normal_(model.decoder.positional_embedding, std=0.02)
        return model

    def inputs(s, padding, g):
        mel = torch.randn(s.batch, 16, 2 * s.seq, generator=g)
        return (mel, _ids(s, g, seq=s.dec_seq)), {}

    return Adapter("whisper Whisper", build, inputs, modality="audio")
