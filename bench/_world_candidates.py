"""Which transformers model types the world corpus attempts, and with which class.

The candidates are the union of transformers' `MODEL_*_MAPPING_NAMES`. Each model type gets
one class and one input kind, in a fixed order of preference (the first that applies):

1. speech seq2seq (whisper, speech_to_text, moonshine, speecht5): log-mel or raw audio in,
   decoder tokens out;
2. dual encoders (CLIP and its kin): text and pixels;
3. video (timesformer, videomae, vivit): frames;
4. multimodal models that need processor-made placeholder tokens: not attempted (their text
   stacks are covered by the `*_text` towers and base LMs);
5. text seq2seq: `*ForConditionalGeneration`;
6. masked LM: `*ForMaskedLM` (bert-like types that are also causal LMs go here);
7. causal LM: `*ForCausalLM`;
8. CTC or audio classification: the base audio model;
9. image: the base vision model (the classification model where no base model is mapped);
10. `*_text` towers of multimodal models: the base text model (`decoder_base`).

Everything else (detection heads, time series, codecs, config-only types, ...) is skipped with
the reason.
"""

import functools
from dataclasses import dataclass

SPEECH = ("moonshine", "speech_to_text", "speecht5", "whisper")
DUAL = (
    "altclip",
    "chinese_clip",
    "clip",
    "metaclip_2",
    "owlv2",
    "owlvit",
    "siglip",
    "siglip2",
    "x_clip",
)
VIDEO = ("timesformer", "videomae", "vivit")
# The classes a speech type is built as (speecht5 has several heads; this one reads audio).
SPEECH_CLASS = {"speecht5": "SpeechT5ForSpeechToText"}


@dataclass(frozen=True)
class Candidate:
    model_type: str
    kind: str  # decoder, decoder_base, encoder, encdec, speech, audio, vision, video, dual
    class_name: str


def _mappings():
    from transformers.models.auto import modeling_auto

    names = sorted(n for n in dir(modeling_auto) if n.endswith("_MAPPING_NAMES"))
    return {
        n: getattr(modeling_auto, n) for n in names if isinstance(getattr(modeling_auto, n), dict)
    }


def _first(value):
    return value[0] if isinstance(value, (list, tuple)) else value


def _multimodal(maps) -> set:
    return set(maps["MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"]) | set(
        maps["MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES"]
    )


def _classify(model_type: str, maps: dict, multimodal: set):
    """(Candidate, None) or (None, reason the type is not attempted)."""
    base = maps["MODEL_MAPPING_NAMES"]
    s2s = maps["MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"]
    audio = {
        **maps["MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES"],
        **maps["MODEL_FOR_CTC_MAPPING_NAMES"],
    }
    image = {
        **maps["MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"],
        **maps["MODEL_FOR_IMAGE_MAPPING_NAMES"],
    }
    if model_type in SPEECH:
        name = (
            SPEECH_CLASS.get(model_type)
            or maps["MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"][model_type]
        )
        return Candidate(model_type, "speech", _first(name)), None
    for kinds, kind in ((DUAL, "dual"), (VIDEO, "video")):
        if model_type in kinds:
            return Candidate(model_type, kind, _first(base[model_type])), None
    if model_type in multimodal:
        return None, "multimodal: needs processor-made placeholder tokens"
    if model_type in maps["MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"]:
        return None, "speech seq2seq with its own feature pipeline"
    if model_type in s2s:
        if _has_sub_config(model_type, ("audio_config", "vision_config", "speech_config")):
            return None, "multimodal seq2seq: needs processor-made inputs"
        return Candidate(model_type, "encdec", _first(s2s[model_type])), None
    for mapping, kind in (
        ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "encoder"),
        ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "decoder"),
        ("MODEL_FOR_CAUSAL_IMAGE_MODELING_MAPPING_NAMES", "decoder"),  # ImageGPT: pixel tokens
    ):
        if model_type in maps[mapping]:
            return Candidate(model_type, kind, _first(maps[mapping][model_type])), None
    if model_type in audio:
        return Candidate(model_type, "audio", _first(base.get(model_type, audio[model_type]))), None
    if model_type in image:
        return Candidate(
            model_type, "vision", _first(base.get(model_type, image[model_type]))
        ), None
    if model_type.endswith("_text") and model_type in base:
        return Candidate(model_type, "decoder_base", _first(base[model_type])), None
    return (
        None,
        "no plain forward of a kind the corpus feeds (detection, time series, codec, sub-tower, config only)",
    )


def _has_sub_config(model_type: str, names) -> bool:
    from transformers import CONFIG_MAPPING

    try:
        subs = getattr(CONFIG_MAPPING[model_type], "sub_configs", {}) or {}
    except KeyError:
        return False
    return any(n in subs for n in names)


@functools.cache
def candidates():
    """(sorted candidates, {model_type: reason} of the types not attempted)."""
    maps = _mappings()
    types = sorted({t for m in maps.values() for t in m if isinstance(t, str)})
    multimodal = _multimodal(maps)
    chosen, skipped = [], {}
    for model_type in types:
        candidate, reason = _classify(model_type, maps, multimodal)
        if candidate is None:
            skipped[model_type] = reason
        else:
            chosen.append(candidate)
    return chosen, skipped
