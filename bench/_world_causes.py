"""Known causes of what the world corpus reports, by subject and kind.

The ids (F1-F13, T1, C1-C3) are those of the field report
(shared/research/field-reports/broad-transformers.md); W-ids are causes first seen here. A
row goes when its cause is fixed and the run no longer shows it; a result with no row says
"not diagnosed".
"""

F1 = "F1: a flatten to rows (`reshape(-1, D)`) read as mixing positions with features"
CAUSES = {
    **{
        (n, "view_mixes_axes"): F1
        for n in (
            "qwen3_next",
            "qwen3_5_text",
            "qwen3_5_moe_text",
            "olmo_hybrid",
            "lara_mini",
            "convbert",
            "prophetnet",
            "sew",
            "sew-d",
        )
    },  # fmt: skip
    ("xlnet", "view_mixes_axes"): "F2: the Transformer-XL relative shift",
    ("funnel", "view_mixes_axes"): "F2: the Transformer-XL relative shift",
    ("xglm", "view_mixes_axes"): "F3: a length read from a later assignment",
    ("wavlm", "view_mixes_axes"): "F5: a (batch x heads) fold of a bias repeated over the batch",
    ("speecht5", "view_mixes_axes"): "F6: a raw-audio batch axis not taken for the batch",
    ("mobilevit", "view_mixes_axes"): "F7: MobileViT's unfold, permuted one op later",
    ("funnel", "layout_bshd"): "F8: an einsum that keeps the heads as a batch letter",
    ("longformer", "mask_dtype"): "F9: the method form `x.where(cond, y)`",
    ("led", "mask_dtype"): "F9: the method form `x.where(cond, y)`",
    ("recurrent_gemma", "mask_dtype"): "F10: a bool used as 0/1 in a recurrence",
    ("kimi_linear", "mask_axis"): "F11: a masked decay matrix read as scores",
    ("deepseek_v4", "mask_fully_masked"): "F12: -inf scores that feed topk, not softmax",
    ("speecht5", "score_bias_constant"): "F13: a bias over a one-key sequence",
    ("prophetnet", "batch_mixing"): "T1: a real transformers bug (predict-stream positions)",
    **{
        (
            n,
            "view_mixes_axes@generate",
        ): "F4: a Mamba-2 decode step's state-times-vector bmm read as attention"
        for n in ("bamba", "falcon_h1", "granitemoehybrid", "mamba2", "nemotron_h", "zamba2")
    },  # fmt: skip
    **{
        (n, "crash"): "C1: `tensor * numpy scalar` inside a trace"
        for n in ("ctrl", "pegasus_x", "reformer")
    },
    ("perceiver", "check"): "C2: a probe crash on more queries than keys",
    ("persimmon", "check"): "C3: a probe's own crash reported as a failure",
    ("ergo", "check"): "C3: a probe's own crash reported as a failure",
    ("albert", "check"): "head permutation across a layer shared over depth (field report)",
    (
        "conditional_detr",
        "check",
    ): "a per-head positional query the head permutation does not reach (field report)",
    ("vit_mae", "check"): "random masking from the global RNG (field report)",
    (
        "moshi",
        "check",
    ): "real: the full forward ignores sliding_window, cached decoding applies it (field report)",
    (
        "bamba",
        "check",
    ): "real: positions restart at 0 given a cache without position_ids (field report)",
    ("swin2sr", "check"): "an image axis cut as a sequence by the length probe (field report)",
    **{
        (
            n,
            "check",
        ): "key padding moves the outputs through a convolution over positions: accurate, not an attention bug"
        for n in ("convbert", "mobilebert", "nystromformer", "conformer")
    },  # fmt: skip
    (
        "siglip",
        "check",
    ): "SigLIP's text tower pools the last token, a pad under right padding: accurate",
    (
        "siglip2",
        "check",
    ): "SigLIP's text tower pools the last token, a pad under right padding: accurate",
    (
        "recurrent_gemma",
        "check",
    ): "a recurrence that ignores the mask (field report): accurate, not an attention bug",
    (
        "deepseek_v4",
        "check",
    ): "DeepSeek-V4's compressor mixes padded positions (field report: not investigated further)",
    (
        "prophetnet",
        "check",
    ): "T1: a real transformers bug (predict-stream positions gathered in the wrong order)",
    ("led", "check"): (
        "W3, moving with the probes' changes: on the full run's tree a view_mixes_axes finding in check's "
        "own trace (LED's decoder cross-attention `key_states.view(bsz, -1, H, D)` read against input_ids' "
        "axis 0; the forward traces are clean); on 1dcafa2 (the --quick run) a key-padding failure instead"
    ),
    (
        "pegasus_x",
        "check",
    ): "not diagnosed: key padding moves PEGASUS-X's outputs by 0.27 (its block-local and global tokens?)",
    ("perceiver-pytorch", "view_mixes_axes"): (
        "W1: a channels-last input [B, H, W, C] flattened to its H*W positions, read as channels-first"
    ),
    ("nystrom-attention", "mask_fully_masked"): (
        "W2: query rows the model padded itself (to a multiple of the landmarks) hidden whole; their outputs are cut off"
    ),
}


def cause_of(name: str, kind: str) -> str:
    return CAUSES.get((name, kind), "not diagnosed")
