"""The size settings, padding layouts and the fixed lists of the world corpus."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Sizes:
    tag: str
    batch: int
    seq: int
    dec_seq: int
    heads: int
    kv_heads: int
    head_dim: int
    image: int = 32
    patch: int = 8
    vision_batch: int = 0  # the batch of vision models where it differs

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim


SIZES = {
    # d: pairwise distinct (batch 3, seq 7, decoder 5, heads 4, kv heads 2, head_dim 16).
    "d": Sizes("d", batch=3, seq=7, dec_seq=5, heads=4, kv_heads=2, head_dim=16, vision_batch=3),
    # c: coincident, batch == seq == head_dim (8, hidden 32); vision: batch == head_dim ==
    # patches == 16 (a 32-pixel image cut in 8-pixel patches has 16).
    "c": Sizes("c", batch=8, seq=8, dec_seq=8, heads=4, kv_heads=2, head_dim=8, vision_batch=16),
    # a: all equal, batch == seq == heads == head_dim == 4 (hidden 16); not vision.
    "a": Sizes("a", batch=4, seq=4, dec_seq=4, heads=4, kv_heads=2, head_dim=4),
    # r: realistic, batch 4, heads 8, seq 64, d_k 64 (hidden 512); the REALISTIC decoders.
    "r": Sizes("r", batch=4, seq=64, dec_seq=16, heads=8, kv_heads=4, head_dim=64),
}
# Vision at sizes c: head_dim 16 so that batch == head_dim == patches.
VISION_C = Sizes(
    "c", batch=16, seq=16, dec_seq=8, heads=4, kv_heads=2, head_dim=16, vision_batch=16
)

# Pad tokens of examples 0 and 1 (the others have none), at seq 7 / 8; at seq 64, 17 and 5.
PAD_LEAD = (3, 1)
PAD_LEAD_LONG = (17, 5)
PADDINGS = ("n", "l", "r")  # no mask, left padding (batched generation), right padding

# Well-known decoder LMs that also run at the realistic sizes.
REALISTIC = (
    "bloom",
    "cohere",
    "cohere2",
    "deepseek_v2",
    "deepseek_v3",
    "ernie4_5",
    "falcon",
    "gemma",
    "gemma2",
    "gemma3_text",
    "glm4",
    "gpt2",
    "gpt_bigcode",
    "gpt_neox",
    "gpt_oss",
    "gptj",
    "granite",
    "jamba",
    "llama",
    "mistral",
    "mixtral",
    "mpt",
    "olmo2",
    "olmoe",
    "opt",
    "phi",
    "phi3",
    "phimoe",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "stablelm",
    "starcoder2",
)

# --quick: a fixed sample covering the kinds and the families with known causes.
QUICK = (
    "albert",
    "audio-spectrogram-transformer",
    "bamba",
    "bart",
    "bert",
    "bloom",
    "clip",
    "convbert",
    "ctrl",
    "deberta-v2",
    "deepseek_v3",
    "deepseek_v4",
    "detr",
    "distilbert",
    "electra",
    "falcon",
    "falcon_h1",
    "funnel",
    "gemma2",
    "gemma3_text",
    "gpt2",
    "gpt_neox",
    "gptj",
    "granitemoehybrid",
    "hubert",
    "jamba",
    "kimi_linear",
    "led",
    "llama",
    "longformer",
    "longt5",
    "mamba",
    "mamba2",
    "marian",
    "mistral",
    "mixtral",
    "mobilevit",
    "moshi",
    "mpt",
    "olmo_hybrid",
    "opt",
    "pegasus_x",
    "perceiver",
    "persimmon",
    "phi3",
    "prophetnet",
    "qwen2",
    "qwen3_next",
    "recurrent_gemma",
    "reformer",
    "roberta",
    "sew",
    "siglip",
    "speecht5",
    "swin",
    "t5",
    "vit",
    "wav2vec2",
    "wavlm",
    "whisper",
    "xglm",
    "xlnet",
)
