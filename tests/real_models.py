"""The real-model matrix: tiny transformers models and torch nn modules, with their inputs.

Each configuration is a model (built from a config object: no weights, no download), an
attention implementation, a padding layout and a size setting. Correct third-party models
must give zero findings under `shapeguard.trace`, and their outputs under a trace or a
guard must be bit-identical to a plain forward; `tests/test_real_models.py` asserts it.

    python tests/real_models.py [-v] [--check] [NAME ...]

prints one line per configuration (findings, bit-identity; -v adds each distinct finding
and output difference). NAMEs pick families by prefix (`llama`, `gpt`, `nn.`) and narrow
by impl, padding or size setting (`sdpa`, `left`, `coincident`). `--check` runs
`shapeguard.check` instead: each probe's status per configuration (n/a: not applicable),
each failure and skip with its reason, and the counts per probe.
"""

import functools
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import torch
from torch import nn

import shapeguard

VOCAB, FFN, LAYERS, POSITIONS = 100, 96, 2, 64
PAD, BOS, EOS = 0, 1, 2
TOKENS = dict(vocab_size=VOCAB, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
# Pad tokens of examples 0 and 1 (the others have none). Left padding is the layout of
# batched generation, right padding a tokenizer's default.
PAD_LEAD = (3, 1)


@dataclass(frozen=True)
class Sizes:
    name: str
    batch: int
    seq: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    dec_seq: int  # decoder length of encoder-decoders

    @property
    def hidden(self):
        return self.heads * self.head_dim


SIZES = {
    # batch, seq, heads, kv heads, head_dim, hidden, experts, decoder length: all distinct.
    "distinct": Sizes("distinct", 3, 7, 4, 2, 16, 6, 5),
    # batch == seq == head_dim == kv heads (== experts, as Mixtral-8x7B's 8 and 8).
    "coincident": Sizes("coincident", 8, 8, 16, 8, 8, 8, 8),
    # A prompt as long as head_dim (a 128-token prompt into head_dim 128, scaled down).
    "prompt_is_head_dim": Sizes("prompt_is_head_dim", 3, 16, 4, 2, 16, 6, 5),
    # batch == kv heads == experts (Mixtral-8x7B: 8 experts, 8 kv heads); families
    # without GQA get batch == their kv heads (the heads, or 1 for multi-query).
    "batch_is_kv_heads": Sizes("batch_is_kv_heads", 2, 7, 4, 2, 16, 2, 5),
}


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # decoder, encoder, encdec, vision, clip, speech (Whisper), audio (Wav2Vec2)
    build: Callable  # (Sizes, impl) -> model in eval mode
    impls: tuple = ("eager", "sdpa")  # transformers refuses sdpa for some
    kv: str = "mha"  # kv heads: "gqa" fewer than the heads, "mqa" one, "mha" as many
    moe: bool = False  # has a router over `experts` experts
    image: tuple | None = None  # (side, patch) of a vision model, when not _image's

    def sizes(self, name):
        s = SIZES[name]
        if self.kv != "gqa":
            s = replace(s, kv_heads=s.heads if self.kv == "mha" else 1)
        if name == "batch_is_kv_heads":
            s = replace(s, batch=s.kv_heads)
        if self.kind == "vision" and name == "coincident":
            s = replace(s, batch=4, heads=4, kv_heads=4, head_dim=16)  # see _image
        return s


PADDINGS = {
    "decoder": ("none", "left", "right"),
    "encoder": ("none", "right"),
    "encdec": ("none", "right"),
    "clip": ("none", "right"),
    "vision": ("none",),
    "speech": ("none",),
    "audio": ("none",),
}
SIZE_SETTINGS = {
    "decoder": tuple(SIZES),
    "encoder": ("distinct", "coincident", "prompt_is_head_dim"),
    "encdec": ("distinct", "coincident"),
    "clip": ("distinct", "coincident"),
    "vision": ("distinct", "coincident"),
    "speech": ("distinct", "coincident"),
    "audio": ("distinct", "coincident"),
}


# -- transformers families -----------------------------------------------------------
def _hf(model_cls, config_cls, impl, **config):
    import transformers

    config = getattr(transformers, config_cls)(**config)
    torch.manual_seed(0)
    return getattr(transformers, model_cls)._from_config(config, attn_implementation=impl).eval()


def _model(model_cls, config_cls, names, **extra):
    """A builder: `names(s)` puts the sizes under the family's config names; `extra`
    adds settings, each a value or a function of the sizes."""

    def build(s, impl):
        more = {k: v(s) if callable(v) else v for k, v in extra.items()}
        return _hf(model_cls, config_cls, impl, **names(s), **more)

    return build


def _layers(s):
    """The sizes under transformers' most common config names."""
    layers = dict(hidden_size=s.hidden, intermediate_size=FFN, num_hidden_layers=LAYERS)
    return dict(layers, num_attention_heads=s.heads)


def _bert(s):
    return dict(TOKENS, **_layers(s), max_position_embeddings=POSITIONS)


def _llama(s):
    return dict(_bert(s), num_key_value_heads=s.kv_heads, head_dim=s.head_dim)


def _gpt2(s):
    layers = dict(n_embd=s.hidden, n_inner=FFN, n_layer=LAYERS, n_head=s.heads)
    return dict(TOKENS, **layers, n_positions=POSITIONS)


def _bart(s):
    encoder = dict(encoder_layers=LAYERS, encoder_attention_heads=s.heads, encoder_ffn_dim=FFN)
    decoder = dict(decoder_layers=LAYERS, decoder_attention_heads=s.heads, decoder_ffn_dim=FFN)
    layers = dict(d_model=s.hidden, **encoder, **decoder, max_position_embeddings=POSITIONS)
    return dict(TOKENS, **layers, decoder_start_token_id=EOS)


def _vit(s):
    image, patch = _image(s)
    return dict(_layers(s), image_size=image, patch_size=patch)


def _falcon(s):
    # The new decoder architecture is the one with grouped kv heads (Falcon-40B/180B).
    layers = dict(hidden_size=s.hidden, ffn_hidden_size=FFN, num_hidden_layers=LAYERS)
    heads = dict(num_attention_heads=s.heads, num_kv_heads=s.kv_heads)
    return dict(TOKENS, **layers, **heads, new_decoder_architecture=True)


def _bloom(s):
    return dict(TOKENS, hidden_size=s.hidden, n_layer=LAYERS, n_head=s.heads)


def _gpt_neo(s):
    # Global then local attention (window 4), as GPT-Neo alternates them.
    layers = dict(hidden_size=s.hidden, intermediate_size=FFN, num_layers=LAYERS)
    local = dict(attention_types=[[["global", "local"], 1]], window_size=4)
    return dict(TOKENS, **layers, **local, num_heads=s.heads, max_position_embeddings=POSITIONS)


def _mpt(s):
    layers = dict(d_model=s.hidden, expansion_ratio=2, n_layers=LAYERS, n_heads=s.heads)
    return dict(TOKENS, **layers, max_seq_len=POSITIONS)


def _deepseek_v3(s):
    # Multi-head latent attention (low-rank q and kv; each head a rope part and a no-rope
    # part), then a dense first layer and a routed-experts second one.
    mla = dict(q_lora_rank=48, kv_lora_rank=32, v_head_dim=s.head_dim, head_dim=s.head_dim // 2)
    mla |= dict(qk_rope_head_dim=s.head_dim // 2, qk_nope_head_dim=s.head_dim // 2)
    moe = dict(n_routed_experts=s.experts, n_shared_experts=1, num_experts_per_tok=2)
    moe |= dict(moe_intermediate_size=FFN // 2, first_k_dense_replace=1, n_group=1, topk_group=1)
    return dict(_llama(s), num_key_value_heads=s.heads, **mla, **moe)


def _distilbert(s):
    layers = dict(dim=s.hidden, hidden_dim=FFN, n_layers=LAYERS, n_heads=s.heads)
    return dict(TOKENS, **layers, max_position_embeddings=POSITIONS)


def _t5(s):
    layers = dict(d_model=s.hidden, d_kv=s.head_dim, d_ff=FFN, num_layers=LAYERS)
    return dict(TOKENS, **layers, num_heads=s.heads, decoder_start_token_id=PAD)


def _whisper(s):
    audio = dict(num_mel_bins=_mel(s), max_source_positions=_frames(s) // 2)
    return dict(_bart(s), **audio, max_target_positions=32, decoder_start_token_id=BOS)


def _wav2vec2(s):
    # Two conv layers (kernel 10 stride 5, kernel 3 stride 2) turn samples into frames.
    convs = dict(conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3))
    positions = dict(num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
    return dict(_layers(s), vocab_size=VOCAB, **convs, **positions)


def _swin(s):
    # Shifted windows of 3x3 patches on a 6x6 grid, then one window after the merge.
    image, patch = SWIN_IMAGE
    layers = dict(embed_dim=s.hidden, depths=[1, 1], num_heads=[s.heads, 2 * s.heads])
    return dict(**layers, window_size=3, mlp_ratio=1.5, image_size=image, patch_size=patch)


def _clip(s):
    return dict(text_config=_bert(s), vision_config=_vit(s), projection_dim=24)


def _samples(s):
    # Raw audio for Wav2Vec2: 90 samples make 8 frames (== batch == head_dim), 400 make 39.
    return 90 if s.name == "coincident" else 400


def _mel(s):
    return 8 if s.name == "coincident" else 10


def _frames(s):
    # Whisper's conv stride 2 halves the frames: 16 give 8 positions, 22 give 11.
    return 2 * s.seq if s.name == "coincident" else 22


def _image(s):
    """(side, patch): coincident sizes give a 4x4 grid (== heads == batch) of 16 patches
    (== head_dim), as CLIP ViT-L/14 at 224 px (16x16 grid, 16 heads); else a 5x5 grid."""
    return (32, 8) if s.name == "coincident" else (40, 8)


def _half_head(s):
    return s.head_dim // 2  # a rotary_dim that rotates half of each head


def _hidden(s):
    return s.hidden


def _lm(name):
    """A decoder family's (model class, config class), as transformers names them."""
    return f"{name}ForCausalLM", f"{name}Config"


SWIN_IMAGE = (24, 4)
EXPERTS = dict(num_local_experts=lambda s: s.experts, num_experts_per_tok=2)


FAMILIES = [
    Family("llama", "decoder", _model(*_lm("Llama"), _llama), kv="gqa"),
    Family("mistral", "decoder", _model(*_lm("Mistral"), _llama), kv="gqa"),
    Family(
        "mistral-sliding", "decoder", _model(*_lm("Mistral"), _llama, sliding_window=4), kv="gqa"
    ),
    Family("mixtral", "decoder", _model(*_lm("Mixtral"), _llama, **EXPERTS), kv="gqa", moe=True),
    Family("qwen2", "decoder", _model(*_lm("Qwen2"), _llama), kv="gqa"),
    Family("qwen3", "decoder", _model(*_lm("Qwen3"), _llama), kv="gqa"),
    Family(
        "qwen3-moe",
        "decoder",
        _model(*_lm("Qwen3Moe"), _llama, moe_intermediate_size=FFN // 2, **EXPERTS),
        kv="gqa",
        moe=True,
    ),
    Family("gemma", "decoder", _model(*_lm("Gemma"), _llama), kv="gqa"),
    # Gemma2/3: a sliding layer (window 4) then a global one, as in the released models.
    Family(
        "gemma2",
        "decoder",
        _model(*_lm("Gemma2"), _llama, sliding_window=4),
        impls=("eager",),
        kv="gqa",
    ),
    Family(
        "gemma3",
        "decoder",
        _model(
            "Gemma3ForCausalLM",
            "Gemma3TextConfig",
            _llama,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
        ),
        kv="gqa",
    ),
    Family("phi3", "decoder", _model(*_lm("Phi3"), _llama), kv="gqa"),
    Family("phi", "decoder", _model(*_lm("Phi"), _llama), kv="gqa"),
    Family("starcoder2", "decoder", _model(*_lm("Starcoder2"), _llama), kv="gqa"),
    Family("olmo2", "decoder", _model(*_lm("Olmo2"), _llama), kv="gqa"),
    Family("cohere", "decoder", _model(*_lm("Cohere"), _llama), kv="gqa"),
    Family("falcon", "decoder", _model(*_lm("Falcon"), _falcon), kv="gqa"),
    Family("deepseek-v3", "decoder", _model(*_lm("DeepseekV3"), _deepseek_v3), moe=True),
    Family("gpt2", "decoder", _model("GPT2LMHeadModel", "GPT2Config", _gpt2)),
    Family("gptj", "decoder", _model(*_lm("GPTJ"), _gpt2, rotary_dim=_half_head)),
    Family(
        "codegen", "decoder", _model(*_lm("CodeGen"), _gpt2, rotary_dim=_half_head, n_ctx=POSITIONS)
    ),
    Family("gpt-bigcode", "decoder", _model(*_lm("GPTBigCode"), _gpt2, multi_query=True), kv="mqa"),
    Family("gpt-neox", "decoder", _model(*_lm("GPTNeoX"), _bert)),
    Family("opt", "decoder", _model(*_lm("OPT"), _bert, ffn_dim=FFN, word_embed_proj_dim=_hidden)),
    Family("bloom", "decoder", _model(*_lm("Bloom"), _bloom), impls=("eager",)),
    Family("gpt-neo", "decoder", _model(*_lm("GPTNeo"), _gpt_neo), impls=("eager",)),
    Family("mpt", "decoder", _model(*_lm("Mpt"), _mpt), impls=("eager",)),
    Family("bert", "encoder", _model("BertModel", "BertConfig", _bert)),
    Family("roberta", "encoder", _model("RobertaModel", "RobertaConfig", _bert)),
    Family("distilbert", "encoder", _model("DistilBertModel", "DistilBertConfig", _distilbert)),
    Family(
        "deberta-v2",
        "encoder",
        _model(
            "DebertaV2Model",
            "DebertaV2Config",
            _bert,
            relative_attention=True,
            position_buckets=8,
            pos_att_type=["p2c", "c2p"],
        ),
        impls=("eager",),
    ),
    # Local attention (window 4) on every other layer, as in the released models.
    Family(
        "modernbert",
        "encoder",
        _model(
            "ModernBertModel",
            "ModernBertConfig",
            _bert,
            global_attn_every_n_layers=2,
            local_attention=4,
            cls_token_id=BOS,
            sep_token_id=EOS,
        ),
    ),
    Family("mpnet", "encoder", _model("MPNetModel", "MPNetConfig", _bert), impls=("eager",)),
    Family("t5", "encdec", _model("T5ForConditionalGeneration", "T5Config", _t5)),
    Family("bart", "encdec", _model("BartForConditionalGeneration", "BartConfig", _bart)),
    Family("mbart", "encdec", _model("MBartForConditionalGeneration", "MBartConfig", _bart)),
    Family(
        "whisper",
        "speech",
        _model("WhisperForConditionalGeneration", "WhisperConfig", _whisper),
    ),
    Family("vit", "vision", _model("ViTModel", "ViTConfig", _vit)),
    Family("dinov2", "vision", _model("Dinov2Model", "Dinov2Config", _vit, mlp_ratio=2)),
    Family("swin", "vision", _model("SwinModel", "SwinConfig", _swin), image=SWIN_IMAGE),
    Family("clip", "clip", _model("CLIPModel", "CLIPConfig", _clip)),
    Family("wav2vec2", "audio", _model("Wav2Vec2Model", "Wav2Vec2Config", _wav2vec2)),
]


# -- inputs --------------------------------------------------------------------------
def _token_ids(batch, seq, generator):
    return torch.randint(3, VOCAB, (batch, seq), generator=generator)


def _padding_mask(batch, seq, padding):
    mask = torch.ones(batch, seq, dtype=torch.long)
    for example, pads in enumerate(PAD_LEAD[:batch]):
        if padding == "left":
            mask[example, :pads] = 0
        elif padding == "right":
            mask[example, seq - pads :] = 0
    return mask


def _text(s, padding, generator):
    ids = _token_ids(s.batch, s.seq, generator)
    mask = _padding_mask(s.batch, s.seq, padding)
    # A tokenizer puts the pad id where the mask is 0.
    return {"input_ids": ids.masked_fill(mask == 0, PAD), "attention_mask": mask}


def hf_inputs(family, s, padding):
    g = torch.Generator().manual_seed(0)
    if family.kind == "vision":
        side, _ = family.image or _image(s)
        return {"pixel_values": torch.randn(s.batch, 3, side, side, generator=g)}
    if family.kind == "audio":
        return {"input_values": torch.randn(s.batch, _samples(s), generator=g)}
    if family.kind == "speech":
        features = torch.randn(s.batch, _mel(s), _frames(s), generator=g)
        return {"input_features": features, "decoder_input_ids": _token_ids(s.batch, s.dec_seq, g)}
    inputs = _text(s, padding, g)
    if family.kind == "encdec":
        inputs["decoder_input_ids"] = _token_ids(s.batch, s.dec_seq, g)
    if family.kind == "clip":
        side, _ = _image(s)
        inputs["pixel_values"] = torch.randn(s.batch, 3, side, side, generator=g)
    return inputs


# -- torch nn modules ----------------------------------------------------------------
# Distinct sizes: batch 3, source 7, target 5, heads 4, head_dim 16, d_model 64, FFN 96.
B, S, T, H, E = 3, 7, 5, 4, 64


def _key_padding(batch, seq):
    mask = torch.zeros(batch, seq, dtype=torch.bool)  # True = padding, torch's convention
    for example, pads in enumerate(PAD_LEAD[:batch]):
        mask[example, seq - pads :] = True
    return mask


def _mha(batch_first, padded, need_weights):
    def make():
        torch.manual_seed(0)
        model = nn.MultiheadAttention(E, H, batch_first=batch_first)
        g = torch.Generator().manual_seed(0)
        x = torch.randn((B, S, E) if batch_first else (S, B, E), generator=g)
        kwargs = {"need_weights": need_weights}
        if padded:
            kwargs["key_padding_mask"] = _key_padding(B, S)
        return model, (x, x, x), kwargs

    return make


def _encoder_layer(padded):
    def make():
        torch.manual_seed(0)
        model = nn.TransformerEncoderLayer(E, H, FFN, batch_first=True)
        x = torch.randn(B, S, E, generator=torch.Generator().manual_seed(0))
        return model, (x,), {"src_key_padding_mask": _key_padding(B, S)} if padded else {}

    return make


def _encoder(padded):
    def make():
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(E, H, FFN, batch_first=True)
        # enable_nested_tensor defaults to True: with a padding mask in eval + no_grad,
        # torch packs the real tokens and returns zeros at the padded positions.
        model = nn.TransformerEncoder(layer, 2)
        x = torch.randn(B, S, E, generator=torch.Generator().manual_seed(0))
        return model, (x,), {"src_key_padding_mask": _key_padding(B, S)} if padded else {}

    return make


def _decoder_layer(tgt_len):
    def make():
        torch.manual_seed(0)
        model = nn.TransformerDecoderLayer(E, H, FFN, batch_first=True)
        g = torch.Generator().manual_seed(0)
        tgt, memory = torch.randn(B, tgt_len, E, generator=g), torch.randn(B, S, E, generator=g)
        mask = nn.Transformer.generate_square_subsequent_mask(tgt_len)
        return model, (tgt, memory), {"tgt_mask": mask, "tgt_is_causal": True}

    return make


def _transformer(padded):
    def make():
        torch.manual_seed(0)
        model = nn.Transformer(E, H, 1, 1, FFN, batch_first=True)
        g = torch.Generator().manual_seed(0)
        src, tgt = torch.randn(B, S, E, generator=g), torch.randn(B, T, E, generator=g)
        kwargs = {"tgt_mask": nn.Transformer.generate_square_subsequent_mask(T)}
        if padded:
            kwargs["src_key_padding_mask"] = _key_padding(B, S)
            kwargs["memory_key_padding_mask"] = _key_padding(B, S)
        return model, (src, tgt), kwargs

    return make


# (module, variant, padding, maker): variants are what changes torch's path through it.
TORCH_MODULES = [
    ("nn.MultiheadAttention", "batch_first", "none", _mha(True, False, False)),
    ("nn.MultiheadAttention", "batch_first", "right", _mha(True, True, False)),
    ("nn.MultiheadAttention", "need_weights", "none", _mha(True, False, True)),
    ("nn.MultiheadAttention", "seq_first", "none", _mha(False, False, False)),
    ("nn.MultiheadAttention", "seq_first", "right", _mha(False, True, False)),
    ("nn.TransformerEncoderLayer", "batch_first", "none", _encoder_layer(False)),
    ("nn.TransformerEncoderLayer", "batch_first", "right", _encoder_layer(True)),
    ("nn.TransformerEncoder", "nested_tensor", "none", _encoder(False)),
    ("nn.TransformerEncoder", "nested_tensor", "right", _encoder(True)),
    ("nn.TransformerDecoderLayer", "tgt_shorter", "none", _decoder_layer(T)),
    ("nn.TransformerDecoderLayer", "tgt_as_long", "none", _decoder_layer(S)),
    ("nn.Transformer", "batch_first", "none", _transformer(False)),
    ("nn.Transformer", "batch_first", "right", _transformer(True)),
]
_TORCH_MAKERS = {f"{m}-{v}-{p}": make for m, v, p, make in TORCH_MODULES}
TORCH_IDS = frozenset(_TORCH_MAKERS)  # the configurations that need no transformers


# -- the matrix ----------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    id: str
    family: str  # or the torch module
    impl: str  # attention implementation, or the torch module's variant
    padding: str
    sizes: str


def hf_configs():
    for family in FAMILIES:
        for impl in family.impls:
            for sizes in SIZE_SETTINGS[family.kind]:
                for padding in PADDINGS[family.kind]:
                    cid = f"{family.name}-{impl}-{padding}-{sizes}"
                    yield Config(cid, family.name, impl, padding, sizes)


def torch_configs():
    for module, variant, padding, _ in TORCH_MODULES:
        yield Config(f"{module}-{variant}-{padding}", module, variant, padding, "distinct")


def configs():
    return [*hf_configs(), *torch_configs()]


_FAMILIES = {f.name: f for f in FAMILIES}


@functools.cache
def _hf_model(family_name, impl, sizes):
    family = _FAMILIES[family_name]
    s = family.sizes(sizes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes on tiny configs
        return family.build(s, impl)


def build(config):
    """(model in eval mode, args, kwargs) of one configuration; models are shared."""
    if config.id in _TORCH_MAKERS:
        model, args, kwargs = _TORCH_MAKERS[config.id]()
        return model.eval(), args, kwargs
    family = _FAMILIES[config.family]
    model = _hf_model(config.family, config.impl, config.sizes)
    s = family.sizes(config.sizes)
    return model, (), hf_inputs(family, s, config.padding)


# -- running -------------------------------------------------------------------------
def forward(model, args, kwargs):
    """A forward in eval + no_grad, with transformers' own warnings silenced."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model(*args, **kwargs)


def traced_forward(model, args, kwargs):
    """(output, findings, ShapeWarnings) of one forward inside `shapeguard.trace(mode="warn")`."""
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with shapeguard.trace(mode="warn") as trace:
            out = model(*args, **kwargs)
    shape_warnings = [w for w in caught if issubclass(w.category, shapeguard.ShapeWarning)]
    return out, trace.findings, shape_warnings


def hook_count(model):
    """Module hooks and instance forwards on the tree (the guard's wrapper is one), and
    torch's global hooks: what guard/unguard must restore."""
    from torch.nn.modules import module as torch_module

    local = sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + ("forward" in m.__dict__)
        for m in model.modules()
    )
    return (
        local
        + len(torch_module._global_forward_hooks)
        + len(torch_module._global_forward_pre_hooks)
    )


def guarded_forward(model, args, kwargs):
    """(output, hooks before guard, hooks while guarded, hooks after unguard)."""
    before = hook_count(model)
    shapeguard.guard(model)  # the default, raise mode: as users guard a model
    try:
        during = hook_count(model)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = model(*args, **kwargs)
    finally:
        shapeguard.unguard(model)
    return out, before, during, hook_count(model)


def tensors(obj, path="output", seen=None):
    """Every tensor in an output, with its path: through ModelOutputs, tuples and caches."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        yield path, obj
        return
    if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, nn.Module)):
        return
    seen.add(id(obj))
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from tensors(value, f"{path}.{key}", seen)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from tensors(value, f"{path}[{i}]", seen)
    elif hasattr(obj, "__dict__"):  # transformers' Cache objects hold their tensors as attributes
        for key, value in vars(obj).items():
            yield from tensors(value, f"{path}.{key}", seen)


def _same_bits(a, b):
    if torch.equal(a, b):
        return True
    # NaN != NaN: the same NaNs at the same places are still the same output.
    if not a.is_floating_point() or not torch.equal(a.isnan(), b.isnan()):
        return False
    return torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


def differences(expected, actual):
    """Paths where `actual` is not bit-identical to `expected`, with how far apart they are."""
    want, got = dict(tensors(expected)), dict(tensors(actual))
    if want.keys() != got.keys():
        return [f"tensors differ: {sorted(want.keys() ^ got.keys())}"]
    out = []
    for path, a in want.items():
        b = got[path]
        if a.is_nested or b.is_nested:
            a, b = (t.to_padded_tensor(0.0) if t.is_nested else t for t in (a, b))
        if a.shape != b.shape or a.dtype != b.dtype:
            out.append(f"{path}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
        elif not _same_bits(a, b):
            diff = (a.double() - b.double()).abs().nan_to_num(float("inf")).max().item()
            out.append(f"{path}: max |diff| {diff:.3g}")
    return out


def select(configs, names):
    """Configurations of the named families (prefixes: `gpt`, `nn.`), narrowed by any
    named impl, padding or size setting: `select(cs, ["llama", "mistral", "left"])`."""
    values = {v for c in configs for v in (c.impl, c.padding, c.sizes)}
    narrow = [n for n in names if n in values]
    families = [n for n in names if n not in values]
    return [
        c
        for c in configs
        if (not families or any(c.family.startswith(f) for f in families))
        and all(n in (c.impl, c.padding, c.sizes) for n in narrow)
    ]


def sizes_label(config):
    if config.id in _TORCH_MAKERS:
        _, args, _ = build(config)
        return " ".join("x".join(map(str, a.shape)) for a in args)
    family = _FAMILIES[config.family]
    s = family.sizes(config.sizes)
    label = f"B{s.batch} S{s.seq} H{s.heads} KV{s.kv_heads} D{s.head_dim}"
    if family.kind == "vision":
        image = family.image or _image(s)
        label = "B{} img{}/{} H{} D{}".format(s.batch, *image, s.heads, s.head_dim)
    elif family.kind == "audio":
        label = f"B{s.batch} samples{_samples(s)} H{s.heads} D{s.head_dim}"
    elif family.kind == "speech":
        label = f"B{s.batch} mel{_mel(s)}x{_frames(s)} H{s.heads} D{s.head_dim}"
    if family.kind in ("encdec", "speech"):
        label += f" dec{s.dec_seq}"
    return label + (f" experts{s.experts}" if family.moe else "")


def _kinds(findings):
    counts = {}
    for f in findings:
        counts[f.kind] = counts.get(f.kind, 0) + 1
    return ", ".join(f"{k} x{n}" for k, n in counts.items()) or "-"


def check_matrix(chosen):
    """`shapeguard.check` on each configuration: statuses, failures and skips, and counts."""
    from collections import Counter, defaultdict

    from shapeguard._probes.check import run_probes

    counts = defaultdict(Counter)
    start = time.perf_counter()
    for config in chosen:
        model, args, kwargs = build(config)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = run_probes(model, args, kwargs)
        cells = []
        for r in report.results:
            status = r.status if r.status != "skipped" or r.applicable else "n/a"
            counts[r.name][status] += 1
            cells.append(f"{r.name.split()[0][:10]}={status}")
        print(f"{config.id:58} " + " ".join(cells))
        for r in report.results:
            if r.status == "failed" or (r.status == "skipped" and r.applicable):
                print(f"    {r.status} {r.name}: {r.message.splitlines()[0]}")
    total = Counter()
    for name, by_status in counts.items():
        print(f"{name:32} " + " ".join(f"{k}={v}" for k, v in sorted(by_status.items())))
        total.update(by_status)
    elapsed = time.perf_counter() - start
    print(f"{len(chosen)} configurations, {dict(total)}, {elapsed:.1f} s")


def main(argv):
    """One line per configuration; `-v` adds each distinct finding and output difference."""
    verbose = "-v" in argv
    names = [a for a in argv if a not in ("-v", "--check")]
    torch.set_num_threads(1)
    chosen = select(configs(), names)
    if "--check" in argv:
        check_matrix(chosen)
        return
    start, unclean = time.perf_counter(), 0
    for config in chosen:
        model, args, kwargs = build(config)
        plain = forward(model, args, kwargs)
        nondeterministic = differences(plain, forward(model, args, kwargs))
        out, findings, _ = traced_forward(model, args, kwargs)
        guarded, before, _, after = guarded_forward(model, args, kwargs)
        traced_diff, guarded_diff = differences(plain, out), differences(plain, guarded)
        if nondeterministic:
            same = "plain forward varies"
        else:
            same = f"trace {'!=' if traced_diff else '=='} guard {'!=' if guarded_diff else '=='}"
        same += "" if before == after else f" hooks {before}->{after}"
        unclean += bool(findings or nondeterministic or traced_diff or guarded_diff)
        unclean += before != after
        print(
            f"{config.family:26} {config.impl:13} {config.padding:5} {config.sizes:18} "
            f"{sizes_label(config):34} {same:17} {_kinds(findings)}"
        )
        if verbose:
            seen = set()
            for f in findings:
                line = f"{f.kind}: {f.message.splitlines()[0]}"
                if line not in seen:
                    seen.add(line)
                    print(f"    {line}")
            for what, diff in (("trace", traced_diff), ("guard", guarded_diff)):
                for d in diff:
                    print(f"    {what}: {d}")
    elapsed = time.perf_counter() - start
    print(f"{len(chosen)} configurations, {unclean} not clean, {elapsed:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
