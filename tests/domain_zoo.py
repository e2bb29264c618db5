"""The domain bug zoo (issue 32): attention as vision, diffusion, detection, audio, time series,
graph and multimodal code writes it, each architecture correct and with the bugs people report.

One small from-scratch module per architecture lives in `domain_zoo_<domain>.py`; its `bug=`
switch makes the one change a bug is (None: the correct counterpart). The lines a bug touches,
and the line where it first bites, end in `# <- name`: a finding counts as finding the bug only
on one of them (`about_the_bug`), so a finding on an unrelated line of a buggy module is a false
alarm of its correct part, never a find.

Each `Bug` says what it is after (`source`: the public report, thread or repository it is
written from), how it manifests, and the outcome shapeguard gives today (`expect`: "trace" when
a trace finding or a trace error about the bug names it, "check" when only a failed probe does,
"miss" otherwise; one word for all three sizes, or one per size). bench/domain_zoo.py measures
them; tests/test_domain_zoo.py pins them, so an engine fix shows up as a changed pin.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass

import domain_zoo_audio as audio
import domain_zoo_detection as detection
import domain_zoo_diffusion as diffusion
import domain_zoo_graphs as graphs
import domain_zoo_multimodal as multimodal
import domain_zoo_series as series
import domain_zoo_vision as vision
from domain_zoo_sizes import SETTINGS, Sizes
from torch import nn

__all__ = [
    "ARCHS",
    "BUGS",
    "FALSE_ALARMS",
    "SETTINGS",
    "Arch",
    "Bug",
    "Sizes",
    "about_the_bug",
    "on_marked_line",
]


@dataclass(frozen=True)
class Arch:
    """One architecture: `build(sizes, bug)` makes the module (bug None: correct), `inputs(sizes)`
    one forward's positional inputs."""

    name: str
    domain: str
    build: Callable[[Sizes, str | None], nn.Module]
    inputs: Callable[[Sizes], tuple]
    source_file: str


@dataclass(frozen=True)
class Bug:
    name: str
    arch: str
    source: str
    manifests: str
    expect: str | tuple[str, str, str]
    # The finding kind the trace gives on the bug's lines where it finds it ("a|b": either).
    kind: str = ""

    @property
    def domain(self) -> str:
        return ARCHS[self.arch].domain

    def expected(self, sizes: Sizes) -> str:
        if isinstance(self.expect, str):
            return self.expect
        return self.expect[[s.name for s in SETTINGS].index(sizes.name)]


def _arch(name, domain, module, cls, inputs) -> Arch:
    return Arch(name, domain, cls, inputs, module.__file__)


ARCHS = {
    a.name: a
    for a in (
        _arch("vit", "vision", vision, vision.ViT, vision.image),
        _arch("deit", "vision", vision, vision.DeiT, vision.image),
        _arch("swin", "vision", vision, vision.SwinBlock, vision.swin_image),
        _arch("mae", "vision", vision, vision.MAE, vision.mae_inputs),
        _arch("spatial", "diffusion", diffusion, diffusion.SpatialTransformer, diffusion.latents),
        _arch("legacy_qkv", "diffusion", diffusion, diffusion.LegacyAttentionBlock, diffusion.fmap),
        _arch("dit", "diffusion", diffusion, diffusion.DiTBlock, diffusion.dit_inputs),
        _arch("joint", "diffusion", diffusion, diffusion.JointAttention, diffusion.joint_inputs),
        _arch("detr", "detection", detection, detection.DETRDecoder, detection.detr_inputs),
        _arch("deformable", "detection", detection, detection.DeformAttn, detection.deform_inputs),
        _arch("whisper", "audio", audio, audio.Whisper, audio.whisper_inputs),
        _arch("wav2vec", "audio", audio, audio.Wav2Vec, audio.wav2vec_inputs),
        _arch("informer", "time series", series, series.Informer, series.series_inputs),
        _arch("autoformer", "time series", series, series.Autoformer, series.series_inputs),
        _arch("gat_dense", "graphs", graphs, graphs.DenseGAT, graphs.dense_inputs),
        _arch("gat_sparse", "graphs", graphs, graphs.SparseGAT, graphs.sparse_inputs),
        _arch("perceiver", "multimodal", multimodal, multimodal.Perceiver, multimodal.inputs),
        _arch("resampler", "multimodal", multimodal, multimodal.Resampler, multimodal.inputs),
    )
}

DOMAINS = ("vision", "diffusion", "detection", "audio", "time series", "graphs", "multimodal")

BUGS = [
    # -- vision ------------------------------------------------------------------------------
    Bug(
        "vit_patch_tokens",
        "vit",
        "report: reshape for permute on conv features (vitrioil/Speech-Separation#4, "
        "leaderj1001/Attention-Augmented-Conv2d#21), here after ViT's patch conv",
        "silent: each token holds pieces of every channel at other positions",
        "trace",
        "view_mixes_axes",
    ),
    Bug(
        "vit_softmax_queries",
        "vit",
        "report: nerminnuraydogan/vision-transformer#1 (ViT attention softmax along the wrong "
        "dimension)",
        "silent: columns, not rows, sum to one",
        "trace",
        "softmax_axis",
    ),
    Bug(
        "vit_merge",
        "vit",
        "report: pytorch/pytorch#67651, meta-pytorch/opacus#825 (view(bsz, tgt_len, embed) "
        "without the heads transpose)",
        "silent: each output token holds pieces of other tokens",
        "trace",
        "view_mixes_axes",
    ),
    Bug(
        "deit_pos_resize",
        "deit",
        "injected: the permute before F.interpolate dropped from DeiT/DPT position resizing (isl-"
        "org/DPT#68 quotes the correct code)",
        "silent: the position table is scrambled across positions and features",
        "miss",
    ),
    Bug(
        "swin_partition",
        "swin",
        "report: ByChelsea/CMOS#4 (Swin window partition with view and no permute)",
        "silent: windows are strips of rows, not squares",
        "trace",
        "batch_mixing|view_mixes_axes",
    ),
    Bug(
        "swin_reverse_batch",
        "swin",
        "injected: Swin window_reverse unfolded window-major (DiT-3D/DiT-3D#18 asks about its "
        "batch arithmetic)",
        "silent: images exchange windows (batch mixing)",
        "trace",
        "batch_mixing",
    ),
    Bug(
        "swin_merge",
        "swin",
        "report: the heads merge of pytorch/pytorch#67651 in Swin WindowAttention (repro-"
        "domains/window_attention_merge_hint.py)",
        "silent: heads merged into tokens",
        "trace",
        "view_mixes_axes",
    ),
    Bug(
        "mae_restore_gather_axis",
        "mae",
        "injected: issue 32's field report (MAE random_masking restore gathering on dim=2)",
        "silent: features permuted, tokens left in shuffled order",
        "trace",
        "gather_axis",
    ),
    Bug(
        "mae_shuffle_batch",
        "mae",
        "injected: MAE random_masking with argsort(noise, dim=0)",
        "silent: kept tokens are chosen by batch rank, not at random per image",
        "trace",
        "gather_axis",
    ),
    # -- diffusion ---------------------------------------------------------------------------
    Bug(
        "spatial_softmax_queries",
        "spatial",
        "report: repro-domains/image_tokens_softmax_axis.py; Amshaker/SwiftFormer#4 (softmax over"
        " the wrong axis of image tokens)",
        "silent: over the queries; proj_out is zero-initialised",
        "trace",
        "softmax_axis",
    ),
    Bug(
        "spatial_tokens_reshape",
        "spatial",
        "report: reshape for rearrange on conv features (dmenig/Pytorch-StNet#2), here in SD's "
        "SpatialTransformer",
        "silent: tokens are slices of channels",
        "trace",
        "view_mixes_axes",
    ),
    Bug(
        "spatial_out_reshape",
        "spatial",
        "report: the same slip on the way back (dmenig/Pytorch-StNet#2), in SD's "
        "SpatialTransformer",
        "silent: channels and positions scrambled on the way back",
        "trace",
        "view_mixes_axes",
    ),
    Bug(
        "spatial_mask_repeat",
        "spatial",
        "report: line/lighthouse#77, lsdefine/attention-is-all-you-need-keras#28 (a per-example "
        "mask tiled for the heads in the wrong order)",
        "silent: each example masked with another example's padding",
        "trace",
        "batch_mixing",
    ),
    Bug(
        "spatial_fold_order",
        "spatial",
        "report: lsdefine/attention-is-all-you-need-keras#28 ((b h) against (h b)), in SD's "
        "CrossAttention",
        "silent: examples exchange heads (batch mixing)",
        "trace",
        "batch_mixing",
    ),
    Bug(
        "legacy_einsum_transposed",
        "legacy_qkv",
        "injected: issue 32's field report (guided-diffusion QKVAttentionLegacy with "
        "'bst,bcs->bct')",
        "silent: aggregates over the queries",
        "trace",
        "aggregation_axis",
    ),
    Bug(
        "legacy_softmax_queries",
        "legacy_qkv",
        "report: labmlai/annotated_deep_learning_paper_implementations#146 (DDPM UNet attention "
        "softmax over the queries)",
        "silent: over the queries",
        "trace",
        "softmax_axis",
    ),
    Bug(
        "dit_modulate_tokens",
        "dit",
        "injected: DiT modulate with unsqueeze(0), adaLN broadcast over tokens (issue 32)",
        "loud where batch != tokens; silent at the coincident size: adaLN broadcast over tokens",
        ("trace", "miss", "trace"),
        "broadcast",
    ),
    Bug(
        "dit_fold_order",
        "dit",
        "injected: repro-domains/zero_init_out_check_passes.py's batch mixing, behind DiT's "
        "adaLN-Zero gate",
        "silent: batch mixing behind a zero gate",
        "trace",
        "batch_mixing",
    ),
    Bug(
        "dit_unpatchify",
        "dit",
        "report: huggingface/transformers#18908 review (dims must be rearranged before the "
        "reshape), at DiT's unpatchify",
        "silent: the image is scrambled",
        "trace",
        "view_mixes_axes",
    ),
    Bug(
        "joint_cat_axis",
        "joint",
        "injected: SD3/Flux joint attention concatenating text and image on the heads axis (issue"
        " 32)",
        "loud where text and image lengths differ; silent at the coincident size",
        "trace",
        "torch_error|cat_axis",
    ),
    Bug(
        "joint_split_order",
        "joint",
        "injected: Flux-style joint output split with image first where text comes first",
        "silent: text and image outputs exchanged",
        "trace",
        "segment_slice",
    ),
    Bug(
        "joint_rope_after_transpose",
        "joint",
        "injected: repro-domains/rope_after_transpose.py (lit-llama apply_rope after the "
        "transposes)",
        "silent: rotated along heads, not positions",
        "trace",
        "rotary_axis",
    ),
    # -- detection ---------------------------------------------------------------------------
    Bug(
        "detr_batch_first",
        "detr",
        "report: om-ai-lab/OmDet#19, aipixel/AEMatter#3 (nn.MultiheadAttention without "
        "batch_first fed batch-first tensors)",
        "silent: attention across the batch",
        ("trace", "trace", "trace"),
        "mha_batch|mha_key_padding_mask|misaligned_axes",
    ),
    Bug(
        "detr_mask_polarity",
        "detr",
        "report: facebookresearch/detr#96 (what True means in key_padding_mask)",
        "loud-ish: NaN for an unpadded image, real pixels hidden elsewhere",
        "trace",
        "mask_fully_masked",
    ),
    Bug(
        "deform_offsets_view",
        "deformable",
        "injected: Deformable DETR sampling_offsets viewed with heads before queries (issue 32)",
        "silent: offsets read for the wrong level and point",
        "trace",
        "view_mixes_axes",
    ),
    Bug(
        "deform_weights_softmax",
        "deformable",
        "injected: Deformable DETR attention_weights softmaxed before the per-head view",
        "silent: one softmax across all heads",
        "trace",
        "aggregation_axis",
    ),
    Bug(
        "deform_value_heads",
        "deformable",
        "injected: MSDeformAttn value viewed [N, heads, Len_in, d], heads carved out of tokens",
        "silent: heads carved out of the token axis",
        "trace",
        "view_mixes_axes",
    ),
    # -- audio -------------------------------------------------------------------------------
    Bug(
        "whisper_frames_reshape",
        "whisper",
        "report: reshape for permute after a conv (vitrioil/Speech-Separation#4), at Whisper's "
        "AudioEncoder",
        "silent: frames are slices of channels",
        "trace",
        "view_mixes_axes",
    ),
    Bug(
        "whisper_pos_before_permute",
        "whisper",
        "injected: Whisper's positional embedding added to the [B, D, T] conv output",
        "loud where d_model != frames; silent at the coincident size",
        "trace",
        "broadcast",
    ),
    Bug(
        "whisper_causal_direction",
        "whisper",
        "injected: Whisper's decoder mask built with tril(-1) for triu(1)",
        "silent: hides the past, shows the future",
        "trace",
        "mask_direction",
    ),
    Bug(
        "w2v_seq_first",
        "wav2vec",
        "report: pytorch/pytorch#122959, om-ai-lab/OmDet#19 (batch_first=True forgotten), in a "
        "wav2vec encoder",
        "loud where batch != frames (its padding mask); silent at the coincident size",
        "trace",
        "mha_batch_first|mha_key_padding_mask",
    ),
    Bug(
        "w2v_mask_polarity",
        "wav2vec",
        "report: lucidrains/feedback-transformer-pytorch#6, pytorch/pytorch#24816 (padding-mask "
        "polarity; NaN)",
        "silent: real frames hidden, padding attended (NaN for an unpadded clip)",
        "trace",
        "mask_polarity",
    ),
    # -- time series -------------------------------------------------------------------------
    Bug(
        "informer_embed_reshape",
        "informer",
        "report: reshape for transpose after a conv (proceduralia/pytorch-conv2_1d#1), at "
        "Informer's TokenEmbedding",
        "silent: time steps are slices of features",
        "trace",
        "view_mixes_axes",
    ),
    Bug(
        "informer_scores_einsum",
        "informer",
        "injected: Informer FullAttention einsum 'blhe,bshe->bhsl' (keys first)",
        "silent: the softmax runs over the queries",
        "trace",
        "softmax_axis",
    ),
    Bug(
        "informer_aggregate_transposed",
        "informer",
        "injected: Informer FullAttention einsum 'bhls,blhd->bshd' (over the queries)",
        "silent in self-attention: aggregates over the queries",
        "trace",
        "aggregation_axis",
    ),
    Bug(
        "autoformer_decomp_reshape",
        "autoformer",
        "report: view for permute before a conv/pool (dmenig/Pytorch-StNet#2), at Autoformer's "
        "moving_avg",
        "silent: the trend is averaged across features and time",
        "trace",
        "view_mixes_axes",
    ),
    # -- graphs ------------------------------------------------------------------------------
    Bug(
        "gat_softmax_side",
        "gat_dense",
        "report: LinWeizheDragon/Knowledge-Aware-Graph-Enhanced-GPT-2-for-Dialogue-State-"
        "Tracking#1 (GAT softmax over which node axis)",
        "silent: each source's weights sum to one",
        "trace",
        "aggregation_axis",
    ),
    Bug(
        "gat_aggregate_transposed",
        "gat_dense",
        "injected: dense GAT aggregating with attention.T (issue 32)",
        "silent: messages flow against the edges",
        "trace",
        "aggregation_axis",
    ),
    Bug(
        "gat_heads_merge",
        "gat_dense",
        "report: the heads merge of pytorch/pytorch#67651 in a GAT's multi-head concat",
        "silent: nodes exchange heads",
        "trace",
        "view_mixes_axes",
    ),
    Bug(
        "gat_sparse_softmax_src",
        "gat_sparse",
        "injected: torch_geometric-style softmax grouped by sources (issue 32)",
        "silent: normalised over each source's outgoing edges",
        "trace",
        "edge_weights_other_side",
    ),
    # -- multimodal --------------------------------------------------------------------------
    Bug(
        "perceiver_latents_axis",
        "perceiver",
        "injected: Perceiver latents repeated 'n d -> n b d' (issue 32)",
        "loud where latents != batch; at the coincident size the letter b pairs the latents' "
        "rows with the data's batch",
        ("trace", "trace", "trace"),
        "einsum_dim|misaligned_axes",
    ),
    Bug(
        "perceiver_mask_axis",
        "perceiver",
        "injected: Perceiver cross-attention mask on the latent (query) axis",
        "loud where latents != inputs; silent at the coincident size",
        "trace",
        "mask_axis|mask_broadcast",
    ),
    Bug(
        "perceiver_softmax_queries",
        "perceiver",
        "report: PetrochukM/PyTorch-NLP#2 (attention softmax over the wrong dim), at a Perceiver "
        "cross-attention",
        "silent: over the queries",
        "trace",
        "aggregation_axis|softmax_axis",
    ),
    Bug(
        "resampler_mqa_softmax",
        "resampler",
        "injected: issue 32's field report (PaLM-style multi-query einsum, then softmax over the "
        "queries)",
        "silent: over the queries; the keys have no heads axis",
        "trace",
        "aggregation_axis",
    ),
    Bug(
        "resampler_mqa_merge",
        "resampler",
        "injected: issue 32's field report (a multi-query heads merge without the transpose)",
        "silent: heads merged into latents",
        "trace",
        "view_mixes_axes",
    ),
]


@dataclass(frozen=True)
class FalseAlarm:
    """A finding or failed probe on a correct counterpart today: an engine false alarm, pinned
    so that its fix shows up (what: "trace: kind" or "check: probe name")."""

    arch: str
    sizes: tuple[str, ...]
    what: str
    why: str


_ALL = ("distinct", "coincident", "realistic")
FALSE_ALARMS: list[FalseAlarm] = []  # none left: add one with the engine fix it waits for


def false_alarms(arch: str, size: str, tool: str) -> list[str]:
    """The pinned false alarms of `arch`'s correct counterpart at `size` ("trace" or "check")."""
    return sorted(
        f.what
        for f in FALSE_ALARMS
        if f.arch == arch and size in f.sizes and f.what.startswith(tool)
    )


_MARK = re.compile(r"#\s*<-\s*(.+)$")


def marked_lines(bug: Bug) -> set[int]:
    """The lines of the bug's architecture file marked `# <- name` (names comma-separated, each
    may be followed by a remark in parentheses)."""
    with open(ARCHS[bug.arch].source_file) as f:
        lines = f.read().splitlines()
    marked = set()
    for number, line in enumerate(lines, 1):
        match = _MARK.search(line)
        names = [part.split()[0] for part in match.group(1).split(",")] if match else []
        if bug.name in names:
            marked.add(number)
    return marked


def on_marked_line(name: str, location: str) -> bool:
    """Whether `location` is one of the lines marked `# <- name` (a test that asserts this
    does not move when an edit elsewhere in the zoo's file shifts the lines)."""
    return about_the_bug(next(b for b in BUGS if b.name == name), location)


def about_the_bug(bug: Bug, location: str) -> bool:
    """Whether a finding at `location` ("file:line") points at one of the bug's marked lines."""
    path, _, line = location.rpartition(":")
    source = ARCHS[bug.arch].source_file
    return (
        bool(line.isdigit())
        and path.endswith(source.rsplit("/", 1)[-1])
        and (int(line) in marked_lines(bug))
    )
