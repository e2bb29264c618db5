"""Per-family fixes: only where the generic shrink (`_world_shrink.py`) does not fit.

`FAMILY[model_type](config, sizes)` edits the shrunk config; each entry says why the generic
way fails for that family. `INPUTS[model_type](model, sizes, padding, generator)` makes the
inputs of a family whose inputs are not the generic ones of its kind. `IMAGE_SIDE` gives
the image side of vision models that need more than 32 pixels.
"""

import torch
from _world_inputs import padding_mask, token_ids


def _audio_convs(config, sizes):
    """wav2vec2-like feature encoders: 7 convs of 512 channels (320x downsampling) need
    12,560 samples for 39 frames; two small convs (10x) need 400."""
    config.conv_dim = (32, 32)
    config.conv_stride = (5, 2)
    config.conv_kernel = (10, 3)
    config.num_feat_extract_layers = 2
    # The positional conv: kernel 128 in 16 groups does not fit a hidden size of 16.
    config.num_conv_pos_embeddings = 8
    config.num_conv_pos_embedding_groups = 4 if sizes.hidden >= 16 else 2
    if hasattr(config, "squeeze_factor"):  # SEW: squeeze then upsample by this factor
        config.squeeze_factor = 2
    for name in ("tdnn_dim", "tdnn_kernel", "tdnn_dilation"):  # x-vector heads, unused
        if hasattr(config, name):
            setattr(config, name, getattr(config, name)[:2])
    if hasattr(config, "adapter_kernel_size"):
        config.add_adapter = False


def _whisper(config, sizes):
    """The encoder insists on exactly 2 * max_source_positions mel frames."""
    config.max_source_positions = 2 * sizes.seq
    config.num_mel_bins = 16


def _speech_to_text(config, sizes):
    """Two stride-2 convs over log-mel frames of `input_feat_per_channel` features."""
    config.input_feat_per_channel = 16
    config.max_source_positions = 256
    config.conv_channels = 32
    config.num_conv_layers = 2
    config.conv_kernel_sizes = [5, 5]


def _speecht5(config, sizes):
    """Raw audio through the wav2vec2-like conv stack, then the text decoder."""
    _audio_convs(config, sizes)
    config.max_speech_positions = 1024
    config.max_text_positions = 128
    config.speech_decoder_prenet_units = 32


def _video(config, sizes):
    """16 frames of 224 pixels; 2 frames (one tubelet of 2 for VideoMAE) of 32."""
    config.num_frames = 4
    if isinstance(getattr(config, "tubelet_size", None), int):
        config.tubelet_size = 2
    elif isinstance(getattr(config, "tubelet_size", None), (list, tuple)):  # ViViT: (t, h, w)
        config.tubelet_size = [2, sizes.patch, sizes.patch]


def _ast(config, sizes):
    """A spectrogram of max_length frames x num_mel_bins, cut in 16x16 patches with stride 10."""
    config.max_length = 64
    config.num_mel_bins = 32
    config.patch_size = 8
    config.frequency_stride = 8
    config.time_stride = 8


def _ssm_heads(config, sizes, heads="num_heads", head_dim="head_dim", expand="expand"):
    """Mamba-2 layers: the SSM heads times their width must be expand * hidden; the
    generic shrink sets heads and head_dim as for attention, which breaks that product."""
    width = 16
    setattr(config, head_dim, width)
    setattr(config, heads, getattr(config, expand, 2) * sizes.hidden // width)
    for name in ("n_groups", "mamba_n_groups", "mamba_ngroups"):
        if hasattr(config, name):
            setattr(config, name, 1)
    for name in ("state_size", "mamba_d_state", "ssm_state_size"):
        if hasattr(config, name):
            setattr(config, name, 16)


def _falcon_h1(config, sizes):
    """The SSM width (`mamba_d_ssm`, 1024) and its 128 heads are not shrunk by name, and the
    reference scan pads to chunks of 256: a 7-token forward took 18 s."""
    config.mamba_d_ssm = config.mamba_expand * sizes.hidden
    config.mamba_d_head = 16
    config.mamba_n_heads = config.mamba_d_ssm // 16
    config.mamba_d_state = 16
    config.mamba_chunk_size = 8


def _nemotron_h(config, sizes):
    """128 SSM heads of 64 (8192 wide) and chunks of 128, not shrunk by name."""
    config.mamba_num_heads = 2 * sizes.hidden // 16
    config.mamba_head_dim = 16
    config.ssm_state_size = 16
    config.chunk_size = 8


def _perceiver(config, sizes):
    """The latents have their own width (1280) and count (256), and 26 self-attentions per
    block are not named as layers: a forward took minutes."""
    config.d_latents = sizes.hidden
    config.num_latents = 16
    config.num_self_attends_per_block = 2
    config.num_self_attention_heads = sizes.heads
    config.num_cross_attention_heads = 1


def _mamba2(config, sizes):
    _ssm_heads(config, sizes)


def _bamba(config, sizes):
    """Attention-layer placement: the default (None) puts no attention layer in 2 layers."""
    config.attn_layer_indices = [1]
    _ssm_heads(config, sizes, "mamba_n_heads", "mamba_d_head", "mamba_expand")


def _granitemoehybrid(config, sizes):
    """All 32 default layers are Mamba layers: a second kind is needed to have attention."""
    config.layer_types = ["linear_attention", "full_attention"]
    _ssm_heads(config, sizes, "mamba_n_heads", "mamba_d_head", "mamba_expand")


def _jamba(config, sizes):
    """Attention every 8 layers from layer 4, experts every 2 from 1: none in 2 layers."""
    config.attn_layer_period, config.attn_layer_offset = 2, 1
    config.expert_layer_period, config.expert_layer_offset = 2, 1
    config.mamba_dt_rank = max(1, sizes.hidden // 16)


def _recurrent_gemma(config, sizes):
    """block_types (recurrent, recurrent, attention) repeats: 2 layers keep no attention."""
    config.block_types = ["recurrent", "attention"]
    config.attention_window_size = 4
    config.lru_width = sizes.hidden


def _zamba2(config, sizes):
    """Hybrid layer ids are derived from layers_block_type at construction; the SSM heads
    and the shared attention (over the concatenated 2 * hidden) have their own widths."""
    config.layers_block_type = ["linear_attention", "hybrid"]
    config.hybrid_layer_ids = [1]
    config.mamba_headdim = 16
    config.n_mamba_heads = config.mamba_expand * sizes.hidden // 16
    config.mamba_d_state = 16
    config.attention_hidden_size = 2 * sizes.hidden
    config.attention_head_dim = 2 * sizes.hidden // sizes.heads
    config.kv_channels = sizes.hidden // sizes.heads


def _reformer(config, sizes):
    """Axial position embeddings must sum to hidden and multiply to the max positions;
    chunks of 64 do not fit a 7-token input."""
    config.axial_pos_embds_dim = [sizes.hidden // 2, sizes.hidden // 2]
    config.axial_pos_shape = (8, 16)
    config.max_position_embeddings = 128
    config.attention_head_size = sizes.head_dim
    config.local_attn_chunk_length = 4
    config.lsh_attn_chunk_length = 4
    config.num_buckets = 2
    config.feed_forward_size = 96


def _swin(config, sizes):
    """4 stages that halve a 7x7 window grid do not fit 32 pixels: 2 stages, patches of 2,
    windows of 4 (a 16x16 grid, then 8x8)."""
    config.embed_dim = sizes.hidden // 2 if sizes.hidden >= 32 else sizes.hidden
    config.depths = [1, 1]
    config.num_heads = [sizes.heads, sizes.heads]
    config.window_size = 4
    config.patch_size = 2
    config.image_size = 32
    if hasattr(config, "stage_names"):
        config.stage_names = ["stem", "stage1", "stage2"]
    for name, value in (("out_features", ["stage2"]), ("out_indices", [2])):
        if getattr(config, name, None) is not None:
            setattr(config, name, value)
    if hasattr(config, "pretrained_window_sizes"):
        config.pretrained_window_sizes = [0, 0]
    if hasattr(config, "upscale"):  # Swin2SR: one residual group per depth entry
        config.num_channels_out = getattr(config, "num_channels", 3)


def _detr(config, sizes):
    """The default backbone is timm's ResNet-50 (timm is not installed beside the tested
    torch): transformers' own small ResNet instead."""
    from transformers import ResNetConfig

    config.use_timm_backbone = False
    config.backbone = None
    config.use_pretrained_backbone = False
    config.backbone_config = ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32, 32, 64], depths=[1, 1, 1, 1],
        out_features=["stage2", "stage3", "stage4"] if hasattr(config, "num_feature_levels") else ["stage4"],
    )  # fmt: skip
    if hasattr(config, "num_queries"):
        config.num_queries = 5
    for name in ("encoder_n_points", "decoder_n_points"):
        if hasattr(config, name):
            setattr(config, name, 2)


def _gemma3n(config, sizes):
    """15 of 35 layers share the kv cache of earlier ones (none left in 2 layers), and the
    per-layer inputs have their own vocabulary and width."""
    config.num_kv_shared_layers = 0
    config.vocab_size_per_layer_input = 128
    config.hidden_size_per_layer_input = 16
    config.laurel_rank = 8
    config.activation_sparsity_pattern = [0.0] * config.num_hidden_layers


def _cohere_compass(config, sizes):
    """The default config has empty rope_parameters, which the model indexes by layer type."""
    config.rope_parameters = {
        kind: {"rope_type": "default", "rope_theta": 10000.0}
        for kind in ("full_attention", "sliding_attention")
    }


def _hrm(config, sizes):
    """128 layers in stacks of 16: 2 layers make stacks of 1."""
    config.num_layers_per_stack = 1


def _lfm2(config, sizes):
    """layer_types None is filled from full_attn_idxs at construction, not after a shrink."""
    config.layer_types = ["conv", "full_attention"]


def _esm(config, sizes):
    """The default config has no pad or mask id, which the embeddings need."""
    config.pad_token_id, config.mask_token_id = 1, 2


def _mobilevitv2(config, sizes):
    """Its patches are 2 pixels of a downsampled map: the generic 8 leaves none."""
    config.patch_size = 2


FAMILY = {
    "audio-spectrogram-transformer": _ast,
    "falcon_h1": _falcon_h1,
    "nemotron_h": _nemotron_h,
    "perceiver": _perceiver,
    "bamba": _bamba,
    "cohere_compass_text": _cohere_compass,
    "conditional_detr": _detr,
    "dab-detr": _detr,
    "deformable_detr": _detr,
    "detr": _detr,
    "donut-swin": _swin,
    "esm": _esm,
    "mobilevitv2": _mobilevitv2,
    "gemma3n_text": _gemma3n,
    "granitemoehybrid": _granitemoehybrid,
    "hrm_text": _hrm,
    "jamba": _jamba,
    "lfm2_moe": _lfm2,
    "mamba2": _mamba2,
    "recurrent_gemma": _recurrent_gemma,
    "reformer": _reformer,
    "swin": _swin,
    "swin2sr": _swin,
    "swinv2": _swin,
    "table-transformer": _detr,
    "zamba2": _zamba2,
    "data2vec-audio": _audio_convs,
    "hubert": _audio_convs,
    "sew": _audio_convs,
    "sew-d": _audio_convs,
    "speech_to_text": _speech_to_text,
    "speecht5": _speecht5,
    "timesformer": _video,
    "unispeech": _audio_convs,
    "unispeech-sat": _audio_convs,
    "videomae": _video,
    "vivit": _video,
    "wav2vec2": _audio_convs,
    "wav2vec2-conformer": _audio_convs,
    "wavlm": _audio_convs,
    "whisper": _whisper,
}


def _decoder_ids(model, sizes, generator):
    return token_ids(model.config, sizes.batch, sizes.dec_seq, generator)


def _whisper_inputs(model, sizes, padding, generator):
    c = model.config
    return {
        "input_features": torch.randn(
            sizes.batch, c.num_mel_bins, 2 * c.max_source_positions, generator=generator
        ),
        "decoder_input_ids": _decoder_ids(model, sizes, generator),
    }


def _s2t_inputs(model, sizes, padding, generator):
    c = model.config
    frames = 4 * sizes.seq + 3
    out = {
        "input_features": torch.randn(
            sizes.batch, frames, c.input_feat_per_channel * c.input_channels, generator=generator
        ),
        "decoder_input_ids": _decoder_ids(model, sizes, generator),
    }
    mask = padding_mask(sizes.batch, frames, padding)
    if mask is not None and padding == "r":
        out["attention_mask"] = mask
    return out


def _raw_speech_inputs(model, sizes, padding, generator):
    samples = 5 * (2 * (sizes.seq * 4 - 1) + 3 - 1) + 10
    out = {
        "input_values": torch.randn(sizes.batch, samples, generator=generator),
        "decoder_input_ids": _decoder_ids(model, sizes, generator),
    }
    if padding == "r":
        mask = torch.ones(sizes.batch, samples, dtype=torch.long)
        mask[0, samples - samples // 4 :] = 0
        out["attention_mask"] = mask
    return out


def _moonshine_inputs(model, sizes, padding, generator):
    # Moonshine's conv stem: kernel 127 stride 64, then kernels 7 and 3 with stride 3 and 2.
    samples = 64 * 6 * (sizes.seq + 2) + 127
    out = {
        "input_values": torch.randn(sizes.batch, samples, generator=generator),
        "decoder_input_ids": _decoder_ids(model, sizes, generator),
    }
    if padding == "r":
        mask = torch.ones(sizes.batch, samples, dtype=torch.long)
        mask[0, samples - samples // 4 :] = 0
        out["attention_mask"] = mask
    return out


def _video_inputs(model, sizes, padding, generator):
    c = model.config
    batch = sizes.vision_batch or sizes.batch
    return {
        "pixel_values": torch.randn(
            batch, c.num_frames, 3, c.image_size, c.image_size, generator=generator
        )
    }


def _ast_inputs(model, sizes, padding, generator):
    c = model.config
    return {
        "input_values": torch.randn(sizes.batch, c.max_length, c.num_mel_bins, generator=generator)
    }


def _feature_width(config):
    if getattr(config, "world_feature_width", None):  # read off the first forward's error
        return config.world_feature_width
    for c in (
        config,
        getattr(config, "encoder_config", None),
        getattr(config, "audio_config", None),
    ):
        for name in (
            "feature_projection_input_dim",
            "num_mel_bins",
            "input_dim",
            "feature_size",
            "n_mels",
        ):
            value = getattr(c, name, None) if c is not None else None
            if isinstance(value, int) and value > 1:
                return value
    return 80


def _features_inputs(model, sizes, padding, generator):
    """Audio encoders fed log-mel features [batch, frames, width] (a conv subsampling of 4
    or 8 follows): 8 frames per output position."""
    frames = 8 * sizes.seq
    out = {
        "input_features": torch.randn(
            sizes.batch, frames, _feature_width(model.config), generator=generator
        )
    }
    if padding == "r":
        mask = torch.ones(sizes.batch, frames, dtype=torch.long)
        mask[0, frames - frames // 4 :] = 0
        out["attention_mask"] = mask
    return out


def _siglip2_inputs(model, sizes, padding, generator):
    """NaFlex: pixels come as flattened patches with their grid's shape and a patch mask."""
    from _world_inputs import text

    c = model.config.vision_config
    batch = sizes.vision_batch or sizes.batch
    side = sizes.image // c.patch_size
    out = text(model.config, batch, sizes.seq, padding, generator)
    out["pixel_values"] = torch.randn(
        batch, side * side, c.num_channels * c.patch_size**2, generator=generator
    )
    out["pixel_attention_mask"] = torch.ones(batch, side * side, dtype=torch.long)
    out["spatial_shapes"] = torch.tensor([[side, side]] * batch)
    return out


INPUTS = {
    "siglip2": _siglip2_inputs,
    "audio-spectrogram-transformer": _ast_inputs,
    "granite_speech5_ctc": _features_inputs,
    "lasr_ctc": _features_inputs,
    "parakeet_ctc": _features_inputs,
    "wav2vec2-bert": _features_inputs,
    "moonshine": _moonshine_inputs,
    "speech_to_text": _s2t_inputs,
    "speecht5": _raw_speech_inputs,
    "timesformer": _video_inputs,
    "videomae": _video_inputs,
    "vivit": _video_inputs,
    "whisper": _whisper_inputs,
}

# Vision models whose downsampling needs a larger image than 32 pixels.
IMAGE_SIDE = {"convnext": 64, "convnextv2": 64, "levit": 64, "mobilevit": 64, "mobilevitv2": 64}


def _xmod(model):
    """X-MOD routes through per-language adapters and refuses to run without a language."""
    model.set_default_language(model.config.languages[0] if model.config.languages else "en_XX")


AFTER_BUILD = {"xmod": _xmod}

# Audio models fed log-mel features; their width is read off the first forward's error
# where the config does not name it (`_world_build.adapt`).
FEATURE_INPUTS = tuple(k for k, v in INPUTS.items() if v is _features_inputs)
