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

__all__ = ["ARCHS", "BUGS", "SETTINGS", "Arch", "Bug", "Sizes", "about_the_bug"]


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
        "timm/vit-pytorch forum threads: x.view(B, -1, C) after the patch conv, for "
        "flatten(2).transpose(1, 2)",
        "silent: each token holds pieces of every channel at other positions",
        "trace",
    ),
    Bug(
        "vit_softmax_queries",
        "vit",
        "lucidrains/vit-pytorch issues on attention maps: softmax(dim=-2) over the queries",
        "silent: columns, not rows, sum to one",
        "miss",
    ),
    Bug(
        "vit_merge",
        "vit",
        "timm Attention: (attn @ v).reshape(B, N, C) without .transpose(1, 2)",
        "silent: each output token holds pieces of other tokens",
        "trace",
    ),
    Bug(
        "deit_pos_resize",
        "deit",
        "facebookresearch/deit and timm resize_pos_embed: the pos grid reshaped to [1, C, h, w] "
        "without the permute before interpolation",
        "silent: the position table is scrambled across positions and features",
        "trace",
    ),
    Bug(
        "swin_partition",
        "swin",
        "microsoft/Swin-Transformer window_partition: the view reshaped without its permute",
        "silent: windows are strips of rows, not squares",
        "trace",
    ),
    Bug(
        "swin_reverse_batch",
        "swin",
        "Swin window_reverse forks: windows unfolded window-major where the partition is "
        "batch-major",
        "silent: images exchange windows (batch mixing)",
        "trace",
    ),
    Bug(
        "swin_merge",
        "swin",
        "Swin WindowAttention: (attn @ v).reshape(B_, N, C) without .transpose(1, 2)",
        "silent: heads merged into tokens",
        "trace",
    ),
    Bug(
        "mae_restore_gather_axis",
        "mae",
        "facebookresearch/mae random_masking restore: torch.gather on dim=2 (features) with "
        "ids_restore",
        "silent: features permuted, tokens left in shuffled order",
        "miss",
    ),
    Bug(
        "mae_shuffle_batch",
        "mae",
        "MAE reimplementations: argsort(noise, dim=0), shuffling across the batch",
        "silent: kept tokens are chosen by batch rank, not at random per image",
        "miss",
    ),
    # -- diffusion ---------------------------------------------------------------------------
    Bug(
        "spatial_softmax_queries",
        "spatial",
        "CompVis/stable-diffusion CrossAttention: sim.softmax(dim=-2) on image tokens",
        "silent: over the queries; proj_out is zero-initialised",
        "miss",
    ),
    Bug(
        "spatial_tokens_reshape",
        "spatial",
        "stable-diffusion SpatialTransformer ports: x.reshape(b, h * w, c) for "
        "rearrange('b c h w -> b (h w) c')",
        "silent: tokens are slices of channels",
        "trace",
    ),
    Bug(
        "spatial_out_reshape",
        "spatial",
        "SpatialTransformer ports: x.reshape(b, c, h, w) back from [b, h*w, c]",
        "silent: channels and positions scrambled on the way back",
        "trace",
    ),
    Bug(
        "spatial_mask_repeat",
        "spatial",
        "stable-diffusion CrossAttention mask: repeat 'b j -> (h b) () j' against a (b h) "
        "fold (repro-domains/zero_init_out_check_passes.py)",
        "silent: each example masked with another example's padding",
        "miss",
    ),
    Bug(
        "spatial_fold_order",
        "spatial",
        "SD attention rewrites: heads folded '(b h)' and unfolded '(h b)'",
        "silent: examples exchange heads (batch mixing)",
        "trace",
    ),
    Bug(
        "legacy_einsum_transposed",
        "legacy_qkv",
        "openai/guided-diffusion QKVAttentionLegacy: einsum 'bst,bcs->bct' for 'bts,bcs->bct'",
        "silent: aggregates over the queries",
        "miss",
    ),
    Bug(
        "legacy_softmax_queries",
        "legacy_qkv",
        "guided-diffusion/improved-diffusion ports: softmax(weight, dim=1) on 'bts'",
        "silent: over the queries",
        "miss",
    ),
    Bug(
        "dit_modulate_tokens",
        "dit",
        "facebookresearch/DiT modulate: shift.unsqueeze(0) for unsqueeze(1)",
        "loud where batch != tokens; silent at the coincident size: adaLN broadcast over tokens",
        "trace",
    ),
    Bug(
        "dit_fold_order",
        "dit",
        "DiT attention rewrites under adaLN-Zero: heads folded (b h), unfolded (h b)",
        "silent: batch mixing behind a zero gate",
        "trace",
    ),
    Bug(
        "dit_unpatchify",
        "dit",
        "DiT unpatchify: x.reshape(N, c, h * p, w * p) without the einsum 'nhwpqc->nchpwq'",
        "silent: the image is scrambled",
        "trace",
    ),
    Bug(
        "joint_cat_axis",
        "joint",
        "SD3/Flux joint attention ports: torch.cat((txt_q, img_q), dim=1) (heads) for dim=2",
        "loud where text and image lengths differ; silent at the coincident size",
        "trace",
    ),
    Bug(
        "joint_split_order",
        "joint",
        "black-forest-labs/flux DoubleStreamBlock: attn[:, :img_len] taken as the image, "
        "where text comes first",
        "silent: text and image outputs exchanged",
        "miss",
    ),
    Bug(
        "joint_rope_after_transpose",
        "joint",
        "lit-llama style apply_rope after the heads transpose (repro-domains/"
        "rope_after_transpose.py)",
        "silent: rotated along heads, not positions",
        "miss",
    ),
    # -- detection ---------------------------------------------------------------------------
    Bug(
        "detr_batch_first",
        "detr",
        "facebookresearch/detr issues: nn.MultiheadAttention (seq-first) fed [B, N, C]",
        "silent: attention across the batch",
        "trace",
    ),
    Bug(
        "detr_mask_polarity",
        "detr",
        "DETR/HF ports: key_padding_mask=attention_mask (1 = real) where True means padding",
        "loud-ish: NaN for an unpadded image, real pixels hidden elsewhere",
        "trace",
    ),
    Bug(
        "deform_offsets_view",
        "deformable",
        "fundamentalvision/Deformable-DETR MSDeformAttn: sampling_offsets viewed (.., points, "
        "levels, 2) for (.., levels, points, 2)",
        "silent: offsets read for the wrong level and point",
        "miss",
    ),
    Bug(
        "deform_weights_softmax",
        "deformable",
        "Deformable-DETR reimplementations: attention_weights.softmax(-1) before the per-head view",
        "silent: one softmax across all heads",
        "miss",
    ),
    Bug(
        "deform_value_heads",
        "deformable",
        "MSDeformAttn ports: value.view(N, n_heads, Len_in, d) carving heads out of tokens",
        "silent: heads carved out of the token axis",
        "trace",
    ),
    # -- audio -------------------------------------------------------------------------------
    Bug(
        "whisper_frames_reshape",
        "whisper",
        "openai/whisper AudioEncoder ports: x.reshape(B, T, D) for x.permute(0, 2, 1)",
        "silent: frames are slices of channels",
        "trace",
    ),
    Bug(
        "whisper_pos_before_permute",
        "whisper",
        "whisper ports: positional_embedding added to the conv output [B, D, T]",
        "loud where d_model != frames; silent at the coincident size",
        "trace",
    ),
    Bug(
        "whisper_causal_direction",
        "whisper",
        "whisper decoder mask ports: torch.full(..., -inf).tril(-1) for triu(1)",
        "silent: hides the past, shows the future",
        "trace",
    ),
    Bug(
        "w2v_seq_first",
        "wav2vec",
        "fairseq/torchaudio wav2vec forks: nn.TransformerEncoderLayer without batch_first fed "
        "[B, T, C]",
        "loud where batch != frames (its padding mask); silent at the coincident size",
        "trace",
    ),
    Bug(
        "w2v_mask_polarity",
        "wav2vec",
        "HF forum: src_key_padding_mask=attention_mask (1 = real) into nn.Transformer",
        "silent: real frames hidden, padding attended (NaN for an unpadded clip)",
        "trace",
    ),
    # -- time series -------------------------------------------------------------------------
    Bug(
        "informer_embed_reshape",
        "informer",
        "zhouhaoyi/Informer2020 TokenEmbedding ports: conv output .reshape(B, L, D) for "
        ".transpose(1, 2)",
        "silent: time steps are slices of features",
        "trace",
    ),
    Bug(
        "informer_scores_einsum",
        "informer",
        "Informer/Autoformer FullAttention ports: einsum 'blhe,bshe->bhsl' (keys first)",
        "silent: the softmax runs over the queries",
        "miss",
    ),
    Bug(
        "informer_aggregate_transposed",
        "informer",
        "FullAttention ports: einsum 'bhls,blhd->bshd' for 'bhls,bshd->blhd'",
        "silent in self-attention: aggregates over the queries",
        "miss",
    ),
    Bug(
        "autoformer_decomp_reshape",
        "autoformer",
        "thuml/Autoformer moving_avg ports: x.reshape(B, C, L) before AvgPool1d for "
        "x.permute(0, 2, 1)",
        "silent: the trend is averaged across features and time",
        "trace",
    ),
    # -- graphs ------------------------------------------------------------------------------
    Bug(
        "gat_softmax_side",
        "gat_dense",
        "Diego999/pyGAT issues: softmax(e, dim=0) over targets for dim=1 over sources",
        "silent: each source's weights sum to one",
        "miss",
    ),
    Bug(
        "gat_aggregate_transposed",
        "gat_dense",
        "pyGAT forks: attention.t() @ Wh (aggregating along outgoing edges)",
        "silent: messages flow against the edges",
        "miss",
    ),
    Bug(
        "gat_heads_merge",
        "gat_dense",
        "GAT multi-head concat: out.reshape(N, H * F) from [H, N, F] without transpose",
        "silent: nodes exchange heads",
        "trace",
    ),
    Bug(
        "gat_sparse_softmax_src",
        "gat_sparse",
        "torch_geometric GATConv ports: softmax(alpha, edge_index[0]) (sources) for "
        "edge_index[1] (targets)",
        "silent: normalised over each source's outgoing edges",
        "miss",
    ),
    # -- multimodal --------------------------------------------------------------------------
    Bug(
        "perceiver_latents_axis",
        "perceiver",
        "lucidrains/perceiver-pytorch forks: latents expanded 'n d -> n b d' for 'b n d'",
        "loud where latents != batch; silent at the coincident size",
        "trace",
    ),
    Bug(
        "perceiver_mask_axis",
        "perceiver",
        "perceiver-pytorch cross-attention: mask[:, None, :, None] on the latent (query) axis",
        "loud where latents != inputs; silent at the coincident size",
        "trace",
    ),
    Bug(
        "perceiver_softmax_queries",
        "perceiver",
        "Perceiver cross-attention written after Slot Attention: softmax over the latents",
        "silent: over the queries",
        "miss",
    ),
    Bug(
        "resampler_mqa_softmax",
        "resampler",
        "PaLM-style multi-query einsum (lucidrains/flamingo-pytorch resampler forks): "
        "'b h i d, b j d -> b h i j' then softmax(dim=-2)",
        "silent: over the queries; the keys have no heads axis",
        "miss",
    ),
    Bug(
        "resampler_mqa_merge",
        "resampler",
        "multi-query attention forks: out.reshape(B, N, h * d) for rearrange('b h n d -> b n (h d)')",
        "silent: heads merged into latents",
        "trace",
    ),
]

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


def about_the_bug(bug: Bug, location: str) -> bool:
    """Whether a finding at `location` ("file:line") points at one of the bug's marked lines."""
    path, _, line = location.rpartition(":")
    source = ARCHS[bug.arch].source_file
    return (
        bool(line.isdigit())
        and path.endswith(source.rsplit("/", 1)[-1])
        and (int(line) in marked_lines(bug))
    )
