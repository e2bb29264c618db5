"""Adapters for image attention blocks: timm's families and diffusers' image transformers.

Each builds a small, correct model the way its package's documentation shows (timm through
`timm.create_model(..., pretrained=False)`), at a `Sizes`: heads and head_dim as given, and an
image cut into a grid of `seq` patches where the family takes any grid (`_grid`), so the token
axis has the setting's size (at sizes c, tokens == batch == head_dim). Families whose windows
need an even grid (Swin, MaxViT) take a fixed 8 x 8 grid. The imports are inside the builders.
"""

import math

import torch
from _world_adapters import Adapter

PATCH = 4
VISION_SIZES = ("d", "c", "a", "r")


def _grid(seq):
    """The most nearly square (rows, cols) with rows * cols == seq."""
    rows = max(r for r in range(1, math.isqrt(seq) + 1) if seq % r == 0)
    return rows, seq // rows


def _image(s, g, rows, cols, channels=3, patch=PATCH):
    return torch.randn(s.batch, channels, rows * patch, cols * patch, generator=g)


def _timm(label, name, **kwargs):
    """A ViT-like timm model over a `seq`-patch grid; `kwargs(sizes)` adds its own settings."""

    def build(s):
        import timm

        rows, cols = _grid(s.seq)
        settings = dict(img_size=(rows * PATCH, cols * PATCH), patch_size=PATCH, depth=2,
                        embed_dim=s.hidden, num_heads=s.heads, num_classes=0)  # fmt: skip
        return timm.create_model(name, pretrained=False, **{**settings, **kwargs})

    def inputs(s, padding, g):
        return (_image(s, g, *_grid(s.seq)),), {}

    return Adapter(label, build, inputs, sizes=VISION_SIZES, modality="image")


def _timm_vit():
    # No class token: the tokens are the patches, seq of them.
    return _timm("timm ViT", "vit_tiny_patch16_224", class_token=False, global_pool="avg")


def _timm_deit():
    return _timm("timm DeiT", "deit_tiny_patch16_224")


def _timm_eva():
    return _timm("timm EVA-02 (rotary)", "eva02_tiny_patch14_224")


def _timm_beit():
    return _timm("timm BEiT (relative position bias)", "beit_base_patch16_224")


def _timm_swin(label, name):
    """Two stages over an 8 x 8 grid with 4 x 4 windows: window partition, shifted windows,
    patch merging; heads per stage s.heads and 2 * s.heads."""

    def build(s):
        import timm

        return timm.create_model(name, pretrained=False, img_size=8 * PATCH, patch_size=PATCH,
                                 window_size=4, embed_dim=s.hidden, depths=(2, 2),
                                 num_heads=(s.heads, 2 * s.heads), num_classes=0)  # fmt: skip

    def inputs(s, padding, g):
        return (_image(s, g, 8, 8),), {}

    return Adapter(label, build, inputs, sizes=VISION_SIZES, modality="image")


def _timm_swin_v1():
    return _timm_swin("timm Swin", "swin_tiny_patch4_window7_224")


def _timm_swin_v2():
    return _timm_swin("timm Swin-v2", "swinv2_tiny_window8_256")


def _timm_maxvit():
    """MaxViT: an MBConv, then block (window) and grid attention, over a 32-pixel image."""

    def build(s):
        import timm

        return timm.create_model("maxvit_tiny_tf_224", pretrained=False, img_size=32,
                                 embed_dim=(s.hidden, s.hidden), depths=(1, 1), stem_width=16,
                                 transformer_window_size=4, transformer_grid_size=4,
                                 transformer_dim_head=s.head_dim, num_classes=0)  # fmt: skip

    def inputs(s, padding, g):
        return (_image(s, g, 8, 8),), {}

    return Adapter(
        "timm MaxViT (block + grid)", build, inputs, sizes=VISION_SIZES, modality="image"
    )


TIMM = (_timm_vit, _timm_deit, _timm_eva, _timm_beit, _timm_swin_v1, _timm_swin_v2, _timm_maxvit)


# -- diffusers' image transformers --------------------------------------------------------
def _latents(s, g, channels, grid=None):
    rows, cols = grid or _grid(s.seq)
    return torch.randn(s.batch, channels, 2 * rows, 2 * cols, generator=g)


def _side(s):
    """A square grid's side near sqrt(seq): DiT's unpatchify takes square images only."""
    return max(2, round(math.sqrt(s.seq)))


def _dit():
    def build(s):
        from diffusers import DiTTransformer2DModel

        return DiTTransformer2DModel(num_attention_heads=s.heads, attention_head_dim=s.head_dim,
                                     in_channels=4, num_layers=2, sample_size=2 * _side(s),
                                     patch_size=2, num_embeds_ada_norm=10)  # fmt: skip

    def inputs(s, padding, g):
        timestep = torch.randint(0, 10, (s.batch,), generator=g)
        labels = torch.randint(0, 10, (s.batch,), generator=g)
        latents = _latents(s, g, 4, (_side(s), _side(s)))
        return (latents,), {"timestep": timestep, "class_labels": labels}

    return Adapter(
        "diffusers DiTTransformer2DModel", build, inputs, sizes=VISION_SIZES, modality="image"
    )


def _unet():
    """A UNet2DConditionModel with a cross-attention down block and mid block: the spatial
    Transformer2DModel inside a UNet, as Stable Diffusion's. Its `attention_head_dim` is the
    number of heads (diffusers keeps the name for old checkpoints); the width makes head_dim."""

    def build(s):
        from diffusers import UNet2DConditionModel

        return UNet2DConditionModel(block_out_channels=(s.hidden, s.hidden), layers_per_block=1,
                                    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                                    in_channels=4, out_channels=4, norm_num_groups=8,
                                    sample_size=8, cross_attention_dim=32,
                                    attention_head_dim=s.heads)  # fmt: skip

    def inputs(s, padding, g):
        sample = torch.randn(s.batch, 4, 8, 8, generator=g)
        context = torch.randn(s.batch, s.dec_seq, 32, generator=g)
        timestep = torch.randint(0, 1000, (s.batch,), generator=g)
        return (sample, timestep), {"encoder_hidden_states": context}

    # Not at sizes r: 89M parameters there, 15 s a forward on this machine's CPU.
    return Adapter(
        "diffusers UNet2DConditionModel", build, inputs, sizes=("d", "c", "a"), modality="image"
    )


def _sd3():
    """SD3's MMDiT: JointTransformerBlocks, image and text tokens in one attention."""

    def build(s):
        from diffusers import SD3Transformer2DModel

        rows, cols = _grid(s.seq)
        return SD3Transformer2DModel(sample_size=2 * max(rows, cols), patch_size=2, in_channels=4,
                                     out_channels=4, num_layers=2, attention_head_dim=s.head_dim,
                                     num_attention_heads=s.heads, joint_attention_dim=32,
                                     caption_projection_dim=s.hidden, pooled_projection_dim=16,
                                     pos_embed_max_size=2 * max(rows, cols))  # fmt: skip

    def inputs(s, padding, g):
        context = torch.randn(s.batch, s.dec_seq, 32, generator=g)
        pooled = torch.randn(s.batch, 16, generator=g)
        timestep = torch.randint(0, 1000, (s.batch,), generator=g)
        kwargs = {"encoder_hidden_states": context, "pooled_projections": pooled}
        return (_latents(s, g, 4),), {**kwargs, "timestep": timestep}

    return Adapter(
        "diffusers SD3Transformer2DModel", build, inputs, sizes=VISION_SIZES, modality="image"
    )


def _flux():
    """Flux: a FluxTransformerBlock (joint) and a FluxSingleTransformerBlock, with rotary
    positions from the image and text ids."""

    def build(s):
        from diffusers import FluxTransformer2DModel

        third = s.head_dim // 6 * 2  # three even parts of head_dim, as the rotary axes need
        axes = (s.head_dim - 2 * third, third, third)
        return FluxTransformer2DModel(in_channels=16, num_layers=1, num_single_layers=1,
                                      attention_head_dim=s.head_dim, num_attention_heads=s.heads,
                                      joint_attention_dim=32, pooled_projection_dim=16,
                                      axes_dims_rope=axes)  # fmt: skip

    def inputs(s, padding, g):
        rows, cols = _grid(s.seq)
        image = torch.randn(s.batch, s.seq, 16, generator=g)
        context = torch.randn(s.batch, s.dec_seq, 32, generator=g)
        img_ids = torch.zeros(rows, cols, 3)
        img_ids[..., 1] = torch.arange(rows)[:, None]
        img_ids[..., 2] = torch.arange(cols)[None, :]
        kwargs = {"encoder_hidden_states": context, "img_ids": img_ids.reshape(-1, 3),
                  "txt_ids": torch.zeros(s.dec_seq, 3),
                  "pooled_projections": torch.randn(s.batch, 16, generator=g),
                  "timestep": torch.rand(s.batch, generator=g)}  # fmt: skip
        return (image,), kwargs

    # Not at sizes a: a head_dim of 4 has no three even rotary parts.
    return Adapter(
        "diffusers FluxTransformer2DModel", build, inputs, sizes=("d", "c", "r"), modality="image"
    )


DIFFUSERS = (_dit, _unet, _sd3, _flux)
