"""Seeded inputs for one configuration of a transformers architecture.

Token ids avoid the special ids; padded positions hold the pad id and a 0 in the mask.
Pixel values are `sizes.image` square; raw audio is sized for the small conv stack that the
shrink gives wav2vec2-like models; log-mel features match the model's width. Encoder-decoders
also get `decoder_input_ids`.
"""

import inspect

import torch
from _world_shrink import TOKEN_IDS
from _world_sizes import PAD_LEAD, PAD_LEAD_LONG

AUDIO_KINDS = ("audio",)
TEXT_KINDS = ("decoder", "decoder_base", "encoder", "encdec", "dual")


def forward_params(model) -> set:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def takes_mask(model) -> bool:
    return "attention_mask" in forward_params(model)


def _special_ids(config) -> set:
    out = set()
    for c in (config, getattr(config, "text_config", None), getattr(config, "decoder", None)):
        for name in TOKEN_IDS:
            value = getattr(c, name, None) if c is not None else None
            if isinstance(value, int):
                out.add(value)
            elif isinstance(value, list):
                out.update(v for v in value if isinstance(v, int))
    return out


def vocab_of(config) -> int:
    for c in (config, getattr(config, "text_config", None), getattr(config, "decoder", None)):
        value = getattr(c, "vocab_size", None) if c is not None else None
        if isinstance(value, int) and value > 0:
            return value
    return 128


def token_ids(config, batch, seq, generator):
    vocab = vocab_of(config)
    allowed = torch.tensor(
        [i for i in range(3, vocab) if i not in _special_ids(config)] or [vocab - 1]
    )
    picks = torch.randint(0, len(allowed), (batch, seq), generator=generator)
    return allowed[picks]


def pad_id(config) -> int:
    for c in (config, getattr(config, "text_config", None)):
        value = getattr(c, "pad_token_id", None) if c is not None else None
        if isinstance(value, int):
            return value
    return 0


def padding_mask(batch, seq, padding):
    """[batch, seq] of 1 (token) and 0 (pad): examples 0 and 1 padded, on the left or right."""
    mask = torch.ones(batch, seq, dtype=torch.long)
    if padding == "n":
        return None
    lead = PAD_LEAD_LONG if seq >= 32 else PAD_LEAD
    for i, n in enumerate(lead[:batch]):
        n = min(n, seq - 1)
        if padding == "l":
            mask[i, :n] = 0
        else:
            mask[i, seq - n :] = 0
    return mask


def text(config, batch, seq, padding, generator, with_mask=True):
    ids = token_ids(config, batch, seq, generator)
    out = {"input_ids": ids}
    mask = padding_mask(batch, seq, padding) if with_mask else None
    if mask is not None:
        out["input_ids"] = ids.masked_fill(mask == 0, pad_id(config))
        out["attention_mask"] = mask
    return out


def pixels(config, batch, side, generator):
    vision = getattr(config, "vision_config", None) or config
    channels = getattr(vision, "num_channels", 3) or 3
    return torch.randn(batch, channels, side, side, generator=generator)


def audio_samples(batch, frames, padding, generator):
    """Raw audio for the shrunk conv stack (kernel 10 stride 5, kernel 3 stride 2)."""
    samples = 5 * (2 * (frames - 1) + 3 - 1) + 10
    out = {"input_values": torch.randn(batch, samples, generator=generator)}
    if padding == "r":
        mask = torch.ones(batch, samples, dtype=torch.long)
        mask[0, samples - samples // 4 :] = 0
        out["attention_mask"] = mask
    return out


def make(candidate, model, sizes, padding, generator, image_side):
    """The keyword inputs of one forward."""
    config = model.config
    kind = candidate.kind
    mask_ok = takes_mask(model)
    if kind in ("decoder", "decoder_base", "encoder"):
        return text(config, sizes.batch, sizes.seq, padding, generator, mask_ok)
    if kind == "encdec":
        out = text(config, sizes.batch, sizes.seq, padding, generator, mask_ok)
        out["decoder_input_ids"] = token_ids(config, sizes.batch, sizes.dec_seq, generator)
        return out
    if kind == "vision":
        return {
            "pixel_values": pixels(config, sizes.vision_batch or sizes.batch, image_side, generator)
        }
    if kind == "dual":
        out = text(
            config, sizes.vision_batch or sizes.batch, sizes.seq, padding, generator, mask_ok
        )
        out["pixel_values"] = pixels(
            config, sizes.vision_batch or sizes.batch, image_side, generator
        )
        return out
    if kind == "audio":
        frames = 39 if sizes.tag == "d" else sizes.seq
        return audio_samples(sizes.batch, frames, padding if mask_ok else "n", generator)
    raise ValueError(f"no generic inputs for kind {kind}")
