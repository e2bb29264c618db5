"""Structure before sizes: a bug is found, and correct code is clean, at any sizes.

Every bug of tests/bug_zoo.py runs, in at least two code styles, at three size settings:
distinct (batch 2, heads 3, seq 5, d_k 11), coincident (batch == seq == heads == d_k == 4)
and realistic (batch 4, heads 8, seq 64, d_k 64). What an axis is must come from the data
flow (a head split, a softmax, a mask's consumer), not from a size that happens to be
unique, so the finding is the same in all three: same kind, a hint with the fix, at the
user's line. The fixed code gives no finding anywhere, nor do the correct models, nor
the correct models at drawn sizes that coincide on purpose.

The module also checks the zoo itself: each bug changes the output where it runs, and each
fixed module computes attention as an independent reference does (SDPA on tensors laid
out by hand), so a test here cannot pass by flagging correct code or missing a non-bug.
"""

import functools
import re
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import bug_zoo as zoo
import pytest
import torch
import torch.nn.functional as F
from bug_zoo import Sizes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shapeguard
from shapeguard import ShapeError, ShapeWarning

pytestmark = pytest.mark.no_shapeguard  # the suite's plugin would trace every test itself


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One layer at most: a single thread is faster here and does not stall when other
    processes hold the cores (OpenMP's threads spin waiting for each other)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def findings(model, *args):
    """Findings of one traced forward in warn mode; a loud bug still raises ShapeError."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", ShapeWarning)
        trace = shapeguard.trace(model, *args, mode="warn")
    return trace.findings


def describe(found) -> str:
    return "\n".join(f"[{f.kind}] {f.message}\n  hint: {f.hint}\n  at: {f.location}" for f in found)


# -- where a finding may point ----------------------------------------------------------
def _marks() -> dict:
    """{(bug, kind or None): line numbers} from the `# <- bug, bug/kind` marks of the zoo."""
    table = defaultdict(set)
    for number, line in enumerate(Path(zoo.__file__).read_text().splitlines(), 1):
        found = re.search(r"# <- ([\w/, ]+)$", line)
        for entry in found.group(1).split(",") if found else ():
            name, _, kind = entry.strip().partition("/")
            table[name, kind or None].add(number)
    return table


MARKS = _marks()


def at_marked_line(finding, bug: str) -> bool:
    """The finding points into bug_zoo.py, at a line marked for this bug (and its kind)."""
    path, _, line = finding.location.rpartition(":")
    lines = MARKS[bug, None] | MARKS[bug, finding.kind]
    return Path(path).name == "bug_zoo.py" and line.isdigit() and int(line) in lines


# -- the bugs ---------------------------------------------------------------------------
def everywhere(sizes: Sizes) -> bool:
    return True


def seq_is_d_k(sizes: Sizes) -> bool:
    return sizes.seq == sizes.d_k


def seq_is_heads(sizes: Sizes) -> bool:
    return sizes.seq == sizes.heads


@dataclass(frozen=True)
class Bug:
    """One bug in one style. make(sizes, bug) builds the module (bug=None: the fix) and its
    inputs; the finding has `kind` and a hint containing one of `fix`. Where `silent` is
    false the sizes make the same code fail loudly, with a ShapeError of a `loud` kind."""

    name: str
    style: str
    make: Callable
    kind: str
    fix: tuple[str, ...]
    silent: Callable[[Sizes], bool] = everywhere
    loud: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.name}-{self.style}"


def x_only(s: Sizes):
    return (torch.randn(s.batch, s.seq, s.d_model),)


def x_rope(s: Sizes):
    return (torch.randn(s.batch, s.seq, s.heads * s.rope_d_k),)


def padded(s: Sizes):
    return (torch.randn(s.batch, s.seq, s.d_model), zoo.attention_mask(s))


def seq_first(s: Sizes):
    return (torch.randn(s.seq, s.batch, s.d_model),)


def seq_first_padded(s: Sizes):
    return (torch.randn(s.seq, s.batch, s.d_model), zoo.attention_mask(s) == 0)


def seq_first_model(inputs=seq_first, **options):
    return built(lambda s, bug: zoo.SeqFirstEncoder(s.d_model, s.heads, **options), inputs)


def cross(s: Sizes):
    memory_sizes = Sizes(**{**s.__dict__, "seq": s.seq_k})
    memory = torch.randn(s.batch, s.seq_k, s.d_model)
    return torch.randn(s.batch, s.seq, s.d_model), memory, zoo.attention_mask(memory_sizes)


def with_cache(s: Sizes):
    past = (s.batch, s.heads, s.seq_k - s.seq, s.d_k)
    return torch.randn(s.batch, s.seq, s.d_model), torch.randn(past), torch.randn(past)


def decode_step(s: Sizes):
    q = torch.randn(s.batch, s.heads, s.seq, s.d_k)
    k, v = torch.randn(2, s.batch, s.heads, s.seq_k, s.d_k)
    return q, k, v


def images(s: Sizes):
    return (torch.randn(s.batch, s.channels, *s.image),)


def joint_inputs(s: Sizes):
    """Image patches 2 x (seq // 2) and seq text tokens: as many where seq is even."""
    img = torch.randn(s.batch, s.channels, 2 * s.patch, s.seq // 2 * s.patch)
    return img, torch.randn(s.batch, s.seq, s.d_model)


def seq_is_even(sizes: Sizes) -> bool:
    return sizes.seq % 2 == 0


def joint(layout):
    def factory(s, bug):
        return zoo.JointHeads(s.channels, s.patch, s.d_model, s.heads, layout, bug)

    return built(factory, joint_inputs)


def built(factory, inputs):
    """make(sizes, bug): one seed, so a buggy module and its fix share their weights."""

    def make(s: Sizes, bug=None):
        torch.manual_seed(0)
        model = factory(s, bug)
        return model, inputs(s)

    return make


def tutorial(**options):
    return built(lambda s, bug: zoo.TutorialMHA(s.d_model, s.heads, bug=bug, **options), x_only)


def tutorial_padded():
    return built(lambda s, bug: zoo.TutorialMHA(s.d_model, s.heads, bug=bug), padded)


def hf(impl, inputs=x_only, kv_heads=None):
    def factory(s, bug):
        return zoo.HFAttention(s.d_model, s.heads, kv_heads(s) if kv_heads else s.heads, impl, bug)

    return built(factory, inputs)


def nanogpt(flash=False):
    return built(
        lambda s, bug: zoo.NanoGPTAttention(s.d_model, s.heads, 2 * s.seq, flash, bug), x_only
    )


def timm(inputs=x_only, **options):
    return built(lambda s, bug: zoo.TimmAttention(s.d_model, s.heads, bug=bug, **options), inputs)


def einops_attention(inputs=x_only):
    return built(lambda s, bug: zoo.EinopsAttention(s.d_model, s.heads, bug), inputs)


def of(cls, inputs=x_only):
    """A module built as cls(d_model, heads, bug=bug)."""
    return built(lambda s, bug: cls(s.d_model, s.heads, bug=bug), inputs)


def mha(cls, batch_first, inputs=x_only):
    return built(lambda s, bug: cls(s.d_model, s.heads, batch_first, bug), inputs)


def patches(style):
    return built(lambda s, bug: zoo.PatchEmbed(s.channels, s.patch, s.d_model, style, bug), images)


def relpos(sdpa):
    return built(lambda s, bug: zoo.RelPosAttention(s.d_model, s.heads, s.seq, sdpa, bug), x_only)


def hf_rotary(layout="bshd"):
    def factory(s, bug):
        return zoo.HFRotaryAttention(s.heads * s.rope_d_k, s.heads, s.rope_d_k, layout, bug)

    return built(factory, x_rope)


def llama():
    def factory(s, bug):
        return zoo.LlamaAttention(s.heads * s.rope_d_k, s.heads, s.rope_d_k, s.seq, bug)

    return built(factory, x_rope)


def decode():
    return built(lambda s, bug: functools.partial(zoo.decode_attention, bug=bug), decode_step)


TRANSPOSE = ("transpose(1, 2)",)
BROADCAST = ("broadcast", "rotary_axis")  # loud: cos/sin cannot line up with the heads

BUGS = [
    # 1. heads carved out of the sequence axis
    Bug("carve", "tutorial", tutorial(), "view_mixes_axes", TRANSPOSE),
    Bug("carve", "hf_eager", hf("eager"), "view_mixes_axes", TRANSPOSE),
    Bug("carve", "nanogpt", nanogpt(), "view_mixes_axes", TRANSPOSE),
    Bug("carve", "nanogpt_flash", nanogpt(flash=True), "view_mixes_axes", TRANSPOSE),
    # 2. heads merged back without the transpose
    Bug("merge", "tutorial", tutorial(), "view_mixes_axes", TRANSPOSE),
    Bug("merge", "hf_sdpa", hf("sdpa"), "view_mixes_axes", TRANSPOSE),
    Bug("merge", "nanogpt", nanogpt(), "view_mixes_axes", TRANSPOSE),
    # 3. the transpose after the head split forgotten: [B, S, h, d_k] used as [B, h, S, d_k]
    Bug("no_transpose", "tutorial_matmul", tutorial(), "layout_bshd", TRANSPOSE),
    Bug("no_transpose", "hf_sdpa", hf("sdpa"), "layout_bshd", TRANSPOSE),
    Bug("no_transpose", "timm_sdpa", timm(), "layout_bshd", TRANSPOSE),
    Bug("no_transpose", "nanogpt_flash", nanogpt(flash=True), "layout_bshd", TRANSPOSE),
    # 4. nn.MultiheadAttention(batch_first=False) fed [B, S, E]
    Bug("mha_batch_first", "mha", mha(zoo.MHAEncoder, False), "mha_batch_first", ("batch_first=True",)),
    Bug("mha_batch_first", "encoder_layer", mha(zoo.TorchEncoder, False), "mha_batch_first", ("batch_first=True",)),
    # 5. softmax over the queries
    Bug("softmax_axis", "tutorial", tutorial(), "softmax_axis", ("dim=-1",)),
    Bug("softmax_axis", "hf_eager", hf("eager"), "softmax_axis", ("dim=-1",)),
    Bug("softmax_axis", "nanogpt", nanogpt(), "softmax_axis", ("dim=-1",)),
    Bug("softmax_axis", "einops", einops_attention(), "softmax_axis", ("dim=-1",)),
    # 6. a padding mask on the query axis
    Bug("mask_axis", "tutorial", tutorial_padded(), "mask_axis", ("[:, None, None, :]", "[batch, 1, 1, seq_k]")),
    Bug("mask_axis", "hf_eager_additive", hf("eager", padded), "mask_axis", ("[:, None, None, :]", "[batch, 1, 1, seq_k]")),
    Bug("mask_axis", "timm_sdpa", timm(padded), "mask_axis", ("[:, None, None, :]", "[batch, 1, 1, seq_k]")),
    Bug("mask_axis", "einops", einops_attention(padded), "mask_axis", ("[:, None, None, :]", "[batch, 1, 1, seq_k]", "b 1 1 j")),
    # 7. mask polarity inverted
    Bug("mask_polarity", "tutorial_masked_fill", tutorial_padded(), "mask_polarity", ("mask == 0",)),
    Bug("mask_polarity", "timm_sdpa_bool", timm(padded), "mask_polarity", ("~keep", "~attn_mask", "!= 0")),
    Bug("mask_polarity", "mha_key_padding_mask", mha(zoo.MHAEncoder, True, padded), "mask_polarity", ("~key_padding_mask", "~pad", "== 0")),
    # 8. a causal triangle that hides the past
    Bug("mask_direction", "tutorial", tutorial(causal=True), "mask_direction", ("tril",)),
    Bug("mask_direction", "nanogpt", nanogpt(), "mask_direction", ("tril",)),
    Bug("mask_direction", "timm_sdpa", timm(causal=True), "mask_direction", ("tril",)),
    # 9. heads folded into the batch in one order, unfolded in the other
    Bug("fold_order", "tutorial_bmm", of(zoo.FoldedHeads), "batch_mixing", ("view(batch, heads", "view(B, h", "view({batch}, {heads}")),
    Bug("fold_order", "einops_bmm", of(zoo.EinopsFolded), "batch_mixing", ("(b h)",)),
    # 10. a per-example nn.MultiheadAttention mask repeated in the wrong order
    Bug("mask_repeat", "mha_repeat", of(zoo.MHAPerExampleMask, padded), "batch_mixing", ("repeat_interleave",)),
    Bug("mask_repeat", "einops_repeat", of(zoo.EinopsMHAMask, padded), "batch_mixing", ("repeat_interleave", "(b h)")),
    Bug("mask_repeat", "einops_fill", of(zoo.EinopsMaskedFold, padded), "batch_mixing", ('"b j -> (b h) () j"',)),
    Bug("mask_repeat", "bmm_fill", of(zoo.BmmMaskedFold, padded), "batch_mixing", ("repeat_interleave",)),
    # 11. a score bias constant along the keys, which softmax cancels
    Bug("bias_constant", "tutorial_alibi", of(zoo.AlibiAttention), "score_bias_constant", ("1, seq_k]", "seq_q, seq_k]")),
    Bug("bias_constant", "bloom_baddbmm", of(zoo.BloomAttention), "score_bias_constant", ("1, seq_k]", "seq_q, seq_k]")),
    Bug("bias_constant", "sdpa_float_mask", of(zoo.SdpaAlibi), "score_bias_constant", ("1, seq_k]", "seq_q, seq_k]")),
    # 12. a patch grid flattened without the permute
    Bug("patchify", "reshape", patches("reshape"), "view_mixes_axes", ("permute",)),
    Bug("patchify", "split_grid", patches("split"), "view_mixes_axes", ("permute",)),
    Bug("patchify", "unfold", patches("unfold"), "view_mixes_axes", ("transpose(1, 2)",)),
    # 13. a gathered [S*S, h] relative-position bias viewed as [h, S, S]
    Bug("relpos_view", "swin_matmul", relpos(sdpa=False), "view_mixes_axes", ("permute(2, 0, 1)",)),
    Bug("relpos_view", "sdpa_float_mask", relpos(sdpa=True), "view_mixes_axes", ("permute(2, 0, 1)",)),
    # 14. products that contract the wrong axes, silent only where seq == d_k
    Bug("contraction", "einsum", einops_attention(), "contraction_axes", ("bhqd,bhkd",), seq_is_d_k, ("einsum_dim",)),
    Bug("contraction", "tutorial_attn_v", tutorial(), "contraction_axes", ("attn @ V", "torch.matmul(attn, V)", "without the transpose"), seq_is_d_k, ("matmul_inner",)),
    Bug("contraction", "hf_eager_q_k", hf("eager"), "contraction_axes", ("transpose(2, 3)", "transpose(-2, -1)"), seq_is_d_k, ("matmul_inner",)),
    # 15. rotary cos/sin along the heads, silent only where seq == heads
    Bug("rotary_axis", "hf_rotate_half", hf_rotary(), "rotary_axis", ("unsqueeze_dim=2",), seq_is_heads, BROADCAST),
    Bug("rotary_axis", "llama_freqs_cis", llama(), "rotary_axis", ("unsqueeze_dim=2", "seq, 1, "), seq_is_heads, BROADCAST),
    # 16. is_causal=True on a decode step against a cache
    Bug("causal_alignment", "functional_sdpa", decode(), "causal_alignment", ("tril(",)),
    Bug("causal_alignment", "hf_cache", of(zoo.HFCachedAttention, with_cache), "causal_alignment", ("tril(",)),
    # 17. text and image tokens concatenated along their heads, silent where their lengths agree
    Bug("cat_axis", "joint_bshd", joint("bshd"), "cat_axis", ("dim=1)",), seq_is_even, ("torch_error",)),
    Bug("cat_axis", "joint_bhsd", joint("bhsd"), "cat_axis", ("dim=2)",), seq_is_even, ("torch_error",)),
]  # fmt: skip


# Correct models in each style: no finding at any sizes, and the same output as a reference.
CORRECT = {
    "tutorial": tutorial(),
    "tutorial_padded": tutorial_padded(),
    "tutorial_causal": tutorial(causal=True),
    "tutorial_bmm": of(zoo.FoldedHeads),
    "nanogpt": nanogpt(),
    "nanogpt_flash": nanogpt(flash=True),
    "cross_attention": built(lambda s, bug: zoo.CrossAttention(s.d_model, s.heads), cross),
    "hf_gqa_repeat_kv": hf("eager", padded, kv_heads=lambda s: s.kv_heads),
    "hf_gqa_enable_gqa": hf("sdpa", padded, kv_heads=lambda s: s.kv_heads),
    "hf_cache": of(zoo.HFCachedAttention, with_cache),
    "functional_decode": decode(),
    "rope_hf_bshd": hf_rotary("bshd"),
    "rope_hf_bhsd": hf_rotary("bhsd"),
    "rope_llama": llama(),
    "alibi_tutorial": of(zoo.AlibiAttention),
    "alibi_bloom": of(zoo.BloomAttention),
    "alibi_sdpa": of(zoo.SdpaAlibi),
    "t5_relative_bias": built(lambda s, bug: zoo.T5Attention(s.d_model, s.heads), x_only),
    "swin_relative_bias": relpos(sdpa=False),
    "timm_padded": timm(padded),
    "einops": einops_attention(padded),
    "einops_bmm": of(zoo.EinopsFolded),
    "mha_batch_first": mha(zoo.MHAEncoder, True, padded),
    "mha_seq_first": mha(zoo.MHAEncoder, False, padded),
    "encoder_layer_batch_first": mha(zoo.TorchEncoder, True),
    "encoder_layer_seq_first": mha(zoo.TorchEncoder, False),
    # Seq-first code end to end ([seq, batch, d_model] into batch_first=False modules): the
    # input's usual batch-first layout is no witness against it.
    "seq_first_mha": seq_first_model(),
    "seq_first_mha_padded": seq_first_model(seq_first_padded),
    "seq_first_mha_sinusoidal": seq_first_model(positions="sinusoidal"),
    "seq_first_mha_learned": seq_first_model(seq_first_padded, positions="learned"),
    "seq_first_encoder_layer": seq_first_model(torch_layer=True),
    "seq_first_encoder_layer_learned": seq_first_model(positions="learned", torch_layer=True),
    "seq_first_fairseq": built(lambda s, bug: zoo.SeqFirstFolded(s.d_model, s.heads), seq_first),
    "seq_first_fairseq_padded": built(
        lambda s, bug: zoo.SeqFirstFolded(s.d_model, s.heads), seq_first_padded
    ),
    "mha_per_example_mask": of(zoo.MHAPerExampleMask, padded),
    "einops_masked_fold": of(zoo.EinopsMaskedFold, padded),
    "bmm_masked_fold": of(zoo.BmmMaskedFold, padded),
    "patch_permute": patches("split"),
    "patch_conv": patches("conv"),
    "patch_einops": patches("einops"),
    "patch_unfold": patches("unfold"),
    # Softmaxes over a Linear's last axis, sized like attention axes: not attention weights.
    "moe_router_n_experts_heads": built(
        lambda s, bug: zoo.MoEBlock(s.d_model, s.heads, s.kv_heads, s.heads), x_only
    ),
    "moe_router_n_experts_kv_heads": built(
        lambda s, bug: zoo.MoEBlock(s.d_model, s.heads, s.kv_heads, s.kv_heads), x_only
    ),
    "joint_bshd": joint("bshd"),
    "joint_bhsd": joint("bhsd"),
    "token_classifier_n_tags_heads": built(
        lambda s, bug: zoo.TokenClassifier(s.d_model, s.heads, s.heads), padded
    ),
}

SETTINGS = pytest.mark.parametrize("sizes", zoo.SETTINGS, ids=lambda s: s.name)


def test_the_zoo_covers_every_bug_in_two_styles_with_marked_lines():
    styles = defaultdict(set)
    for bug in BUGS:
        styles[bug.name].add(bug.style)
        assert MARKS[bug.name, None], f"{bug.name} has no `# <- {bug.name}` line in bug_zoo.py"
    assert len(styles) == 17 and all(len(s) >= 2 for s in styles.values()), dict(styles)
    assert len({str(bug) for bug in BUGS}) == len(BUGS)


def accepted_kinds(bug: Bug, sizes: Sizes) -> set:
    kinds = {bug.kind}
    if bug.name == "carve" and sizes.seq == sizes.heads:
        # With seq == heads, x.view(B, h, S, d_k) on [B, S, d_model] is the very same call as
        # the head split that forgets its transpose, x.view(B, S, h, d_k): reporting it as
        # that bug, layout_bshd where the tensor is used, is right as well.
        kinds.add("layout_bshd")
    return kinds


@SETTINGS
@pytest.mark.parametrize("bug", BUGS, ids=str)
def test_bug_is_found(bug, sizes):
    model, args = bug.make(sizes, bug.name)
    if not bug.silent(sizes):
        with pytest.raises(ShapeError) as info:
            findings(model, *args)
        assert info.value.kind in bug.loud, str(info.value)
        return
    found = findings(model, *args)
    assert found, f"{bug} at {sizes.name} sizes: no finding"
    assert {f.kind for f in found} <= accepted_kinds(bug, sizes), describe(found)
    fixes = [fix.format(**sizes.__dict__) for fix in bug.fix]
    for finding in found:
        assert any(fix in finding.hint for fix in fixes), f"hint lacks {fixes}\n" + describe(
            [finding]
        )
        assert at_marked_line(finding, bug.name), describe([finding])


@SETTINGS
@pytest.mark.parametrize("bug", BUGS, ids=str)
def test_fixed_code_gives_no_finding(bug, sizes):
    model, args = bug.make(sizes, None)
    found = findings(model, *args)
    assert found == [], describe(found)


@SETTINGS
@pytest.mark.parametrize("name", CORRECT)
def test_correct_model_gives_no_finding(name, sizes):
    model, args = CORRECT[name](sizes)
    found = findings(model, *args)
    assert found == [], describe(found)


# -- the zoo is right: bugs change the output, fixes compute attention ------------------
def in_double(model, args):
    """float64, so that 1e-5 measures the code, not float32 rounding at d_model 512."""
    if isinstance(model, torch.nn.Module):
        model = model.double()
    return model, tuple(a.double() if a.is_floating_point() else a for a in args)


def run(model, args):
    with torch.no_grad():
        return model(*args)


def differs(a, b) -> bool:
    return not torch.allclose(a, b, atol=1e-4, rtol=1e-4)  # NaN never equals


@pytest.mark.parametrize("bug", BUGS, ids=str)
def test_bug_changes_the_output(bug):
    same = []
    for sizes in zoo.SETTINGS:
        if bug.silent(sizes):
            buggy, fixed = run(*bug.make(sizes, bug.name)), run(*bug.make(sizes, None))
            if not differs(buggy, fixed):
                same.append(sizes.name)
    assert not same, f"{bug} computes the fixed output at {same} sizes"


@SETTINGS
@pytest.mark.parametrize("bug", BUGS, ids=str)
def test_fixed_code_matches_the_reference(bug, sizes):
    model, args = in_double(*bug.make(sizes, None))
    torch.testing.assert_close(run(model, args), reference(model, *args), atol=1e-5, rtol=1e-5)


@SETTINGS
@pytest.mark.parametrize("name", CORRECT)
def test_correct_model_matches_the_reference(name, sizes):
    model, args = in_double(*CORRECT[name](sizes))
    torch.testing.assert_close(run(model, args), reference(model, *args), atol=1e-5, rtol=1e-5)


# References: every layout written out by hand here, every attention through SDPA.
def heads_of(t, heads):
    """[B, S, heads * d] -> [B, heads, S, d]."""
    return t.unflatten(-1, (heads, -1)).permute(0, 2, 1, 3)


def merged(t):
    """[B, heads, S, d] -> [B, S, heads * d]."""
    return t.permute(0, 2, 1, 3).flatten(2)


def keep_real_keys(attention_mask):
    """[B, S_k] with 1 for real tokens -> a [B, 1, 1, S_k] SDPA keep-mask."""
    return attention_mask.bool()[:, None, None, :]


def causal_keep(seq_q, seq_k):
    """Query i (the last seq_q of seq_k positions) sees keys up to its own position."""
    i, j = torch.arange(seq_q)[:, None], torch.arange(seq_k)[None, :]
    return j <= i + (seq_k - seq_q)


def alibi_mask(slopes, seq, dtype):
    """[h, S, S]: -slope_h * (i - j) on and below the diagonal, -inf above."""
    i, j = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    bias = -slopes[:, None, None] * (i - j).to(dtype)
    return bias.masked_fill(j > i, float("-inf"))


def sdpa(q, k, v, **kwargs):
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def self_attention(x, projections, heads, **kwargs):
    q, k, v = (heads_of(p(x), heads) for p in projections)
    return merged(sdpa(q, k, v, **kwargs))


def ref_tutorial(model, x, attention_mask=None):
    kwargs = {"is_causal": True} if getattr(model, "causal", False) else {}
    if attention_mask is not None:
        kwargs["attn_mask"] = keep_real_keys(attention_mask)
    out = self_attention(x, (model.W_q, model.W_k, model.W_v), model.n_heads, **kwargs)
    return model.W_o(out)


def ref_alibi(model, x):
    mask = alibi_mask(model.slopes, x.shape[1], x.dtype)
    return model.W_o(
        self_attention(x, (model.W_q, model.W_k, model.W_v), model.n_heads, attn_mask=mask)
    )


def ref_hf(model, x, attention_mask=None):
    q = heads_of(model.q_proj(x), model.num_heads)
    groups = model.num_heads // model.num_key_value_heads
    k, v = (
        heads_of(p(x), model.num_key_value_heads).repeat_interleave(groups, dim=1)
        for p in (model.k_proj, model.v_proj)
    )
    mask = None if attention_mask is None else keep_real_keys(attention_mask)
    return model.o_proj(merged(sdpa(q, k, v, attn_mask=mask)))


def ref_cross(model, x, memory, memory_mask):
    q = heads_of(model.q_proj(x), model.num_heads)
    k, v = (heads_of(p(memory), model.num_heads) for p in (model.k_proj, model.v_proj))
    return model.o_proj(merged(sdpa(q, k, v, attn_mask=keep_real_keys(memory_mask))))


def ref_cached(model, x, past_key, past_value):
    q, k, v = (heads_of(p(x), model.num_heads) for p in (model.q_proj, model.k_proj, model.v_proj))
    k, v = torch.cat([past_key, k], dim=2), torch.cat([past_value, v], dim=2)
    mask = causal_keep(q.shape[2], k.shape[2])
    return model.o_proj(merged(sdpa(q, k, v, attn_mask=mask)))


def ref_decode(model, q, k, v):
    return sdpa(q, k, v, attn_mask=causal_keep(q.shape[2], k.shape[2]))


def rotary_angles(seq, head_dim, dtype):
    """[S, d / 2]: position t times theta_k = 10000^(-2k / d)."""
    theta = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=dtype) / head_dim)
    return torch.arange(seq, dtype=dtype)[:, None] * theta[None, :]


def rotate_halves(t, angles):
    """Rotates feature pairs (k, k + d/2) of [B, h, S, d] by angles [S, d / 2]."""
    a, b = t.chunk(2, dim=-1)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def rotate_pairs(t, angles):
    """Rotates adjacent feature pairs (2k, 2k + 1) of [B, h, S, d] by angles [S, d / 2]."""
    a, b = t[..., 0::2], t[..., 1::2]
    cos, sin = angles.cos(), angles.sin()
    return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)


def ref_hf_rotary(model, x):
    q, k, v = (heads_of(p(x), model.num_heads) for p in (model.q_proj, model.k_proj, model.v_proj))
    angles = rotary_angles(x.shape[1], model.head_dim, x.dtype)
    q, k = rotate_halves(q, angles), rotate_halves(k, angles)
    return model.o_proj(merged(sdpa(q, k, v, is_causal=True)))


def ref_llama(model, x):
    q, k, v = (heads_of(p(x), model.n_heads) for p in (model.wq, model.wk, model.wv))
    angles = rotary_angles(x.shape[1], model.head_dim, x.dtype)
    q, k = rotate_pairs(q, angles), rotate_pairs(k, angles)
    return model.wo(merged(sdpa(q, k, v, is_causal=True)))


def ref_nanogpt(model, x):
    q, k, v = (heads_of(t, model.n_head) for t in model.c_attn(x).chunk(3, dim=-1))
    return model.c_proj(merged(sdpa(q, k, v, is_causal=True)))


def ref_timm(model, x, attention_mask=None):
    q, k, v = (heads_of(t, model.num_heads) for t in model.qkv(x).chunk(3, dim=-1))
    kwargs = {"is_causal": True} if model.causal else {}
    if attention_mask is not None:
        kwargs["attn_mask"] = keep_real_keys(attention_mask)
    return model.proj(merged(sdpa(q, k, v, **kwargs)))


def ref_sdpa_alibi(model, x):
    q, k, v = (heads_of(t, model.num_heads) for t in model.qkv(x).chunk(3, dim=-1))
    mask = alibi_mask(model.slopes, x.shape[1], x.dtype)
    return model.proj(merged(sdpa(q, k, v, attn_mask=mask)))


def ref_relpos(model, x):
    q, k, v = (heads_of(t, model.num_heads) for t in model.qkv(x).chunk(3, dim=-1))
    seq = x.shape[1]
    i, j = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    table = model.relative_position_bias_table  # [2 * seq - 1, heads]
    bias = table[i - j + seq - 1].permute(2, 0, 1)  # bias[h, i, j] = table[i - j, h]
    return model.proj(merged(sdpa(q, k, v, attn_mask=bias[None])))


def ref_bloom(model, x):
    fused = model.query_key_value(x).unflatten(-1, (model.num_heads, 3, model.head_dim))
    q, k, v = (fused[..., n, :].transpose(1, 2) for n in range(3))  # per head: q, k, v
    mask = alibi_mask(model.slopes, x.shape[1], x.dtype)
    return model.dense(merged(sdpa(q, k, v, attn_mask=mask)))


def ref_t5(model, x):
    q, k, v = (heads_of(p(x), model.n_heads) for p in (model.q, model.k, model.v))
    seq = x.shape[1]
    i, j = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    weight = model.relative_attention_bias.weight  # [buckets, heads]
    bias = weight[zoo.relative_position_bucket(j - i)].permute(2, 0, 1)  # [h, S_q, S_k]
    return model.o(merged(sdpa(q, k, v, attn_mask=bias[None], scale=1.0)))


def ref_einops(model, x, attention_mask=None):
    q, k, v = (heads_of(t, model.n_heads) for t in model.to_qkv(x).chunk(3, dim=-1))
    mask = None if attention_mask is None else keep_real_keys(attention_mask)
    return model.to_out(merged(sdpa(q, k, v, attn_mask=mask)))


def ref_mha(attn, x, keep=None):
    """nn.MultiheadAttention on [B, S, E] from its packed in_proj; keep is an SDPA mask."""
    q, k, v = (
        heads_of(t, attn.num_heads)
        for t in F.linear(x, attn.in_proj_weight, attn.in_proj_bias).chunk(3, dim=-1)
    )
    return attn.out_proj(merged(sdpa(q, k, v, attn_mask=keep)))


def ref_mha_encoder(model, x, attention_mask=None):
    x = x + model.pos.weight[: x.shape[1]]
    keep = None if attention_mask is None else keep_real_keys(attention_mask)
    return x + ref_mha(model.attn, x, keep)


def ref_torch_layer(layer, x, keep=None):
    """nn.TransformerEncoderLayer on batch-first x: post-norm, ReLU, no dropout."""
    h = layer.norm1(x + ref_mha(layer.self_attn, x, keep))
    return layer.norm2(h + layer.linear2(F.relu(layer.linear1(h))))


def ref_encoder_layer(model, x):
    return ref_torch_layer(model.layer, x + model.pos.weight[: x.shape[1]])


def ref_seq_first(model, x, src_key_padding_mask=None):
    """[S, B, E] in and out; computed batch-first."""
    S = x.shape[0]
    if model.positions == "sinusoidal":
        x = x + model.pe[:S]
    elif model.positions == "learned":
        x = x + model.pos.weight[:S][:, None]
    x = x.transpose(0, 1)
    keep = None if src_key_padding_mask is None else ~src_key_padding_mask[:, None, None, :]
    if model.layer is not None:
        return ref_torch_layer(model.layer, x, keep).transpose(0, 1)
    return (x + ref_mha(model.attn, x, keep)).transpose(0, 1)


def ref_seq_first_folded(model, x, key_padding_mask=None):
    """[T, B, E] in and out; computed batch-first with SDPA."""
    xb = x.transpose(0, 1)
    q, k, v = (
        heads_of(proj(xb), model.num_heads) for proj in (model.q_proj, model.k_proj, model.v_proj)
    )
    keep = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
    return model.out_proj(merged(sdpa(q, k, v, attn_mask=keep))).transpose(0, 1)


def ref_per_example_mask(model, x, attention_mask):
    keep = causal_keep(x.shape[1], x.shape[1]) & attention_mask.bool()[:, None, :]  # [B, S, S]
    return ref_mha(model.attn, x, keep[:, None])


def ref_patches(model, x):
    B, C, H, W = x.shape
    p = model.patch_size
    rows = [
        x[:, :, i : i + p, j : j + p].reshape(B, C * p * p)  # one patch, as (C, p, p)
        for i in range(0, H, p)
        for j in range(0, W, p)
    ]
    patches = torch.stack(rows, dim=1)
    if model.style == "conv":
        return F.linear(patches, model.proj.weight.flatten(1), model.proj.bias)
    return model.proj(patches)


def ref_moe(model, x):
    h = x + ref_hf(model.attn, x)
    tokens = h.reshape(-1, h.shape[-1])
    out = torch.zeros_like(tokens)
    for t, token in enumerate(tokens):
        probs = torch.softmax(model.gate(token), dim=0)
        best = probs.argsort(descending=True)[: model.top_k]
        for e in best:
            out[t] += probs[e] / probs[best].sum() * model.experts[e](token)
    return h + out.view_as(h)


def ref_classifier(model, x, attention_mask):
    return torch.softmax(model.head(ref_tutorial(model.encoder, x, attention_mask)), dim=-1)


def ref_joint(model, img, txt):
    """Text tokens then image patches as one sequence; each stream's own projections."""
    x = F.conv2d(img, model.patches.weight, model.patches.bias, stride=model.patches.stride)
    x = x.flatten(2).transpose(1, 2)
    qkv = torch.cat((model.txt_qkv(txt), model.img_qkv(x)), dim=1)  # [B, S + N, 3 * d]
    q, k, v = (heads_of(t, model.heads) for t in qkv.chunk(3, dim=-1))
    return model.out(merged(F.scaled_dot_product_attention(q, k, v)))


REFERENCES = {
    zoo.JointHeads: ref_joint,
    zoo.TutorialMHA: ref_tutorial,
    zoo.FoldedHeads: ref_tutorial,
    zoo.AlibiAttention: ref_alibi,
    zoo.HFAttention: ref_hf,
    zoo.CrossAttention: ref_cross,
    zoo.HFCachedAttention: ref_cached,
    zoo.decode_attention: ref_decode,
    zoo.HFRotaryAttention: ref_hf_rotary,
    zoo.LlamaAttention: ref_llama,
    zoo.NanoGPTAttention: ref_nanogpt,
    zoo.TimmAttention: ref_timm,
    zoo.SdpaAlibi: ref_sdpa_alibi,
    zoo.RelPosAttention: ref_relpos,
    zoo.BloomAttention: ref_bloom,
    zoo.T5Attention: ref_t5,
    zoo.EinopsAttention: ref_einops,
    zoo.EinopsFolded: ref_einops,
    zoo.EinopsMaskedFold: ref_einops,
    zoo.BmmMaskedFold: ref_einops,
    zoo.MHAEncoder: ref_mha_encoder,
    zoo.TorchEncoder: ref_encoder_layer,
    zoo.SeqFirstEncoder: ref_seq_first,
    zoo.SeqFirstFolded: ref_seq_first_folded,
    zoo.MHAPerExampleMask: ref_per_example_mask,
    zoo.EinopsMHAMask: ref_per_example_mask,
    zoo.PatchEmbed: ref_patches,
    zoo.MoEBlock: ref_moe,
    zoo.TokenClassifier: ref_classifier,
}


def reference(model, *args):
    key = model.func if isinstance(model, functools.partial) else type(model)
    with torch.no_grad():
        return REFERENCES[key](model, *args)


# -- sizes that coincide on purpose ------------------------------------------------------
EQUALITIES = (
    "seq == d_k",
    "batch == heads",
    "batch == kv_heads",
    "seq == heads",
    "batch == seq",
    "batch == d_k",
)


@st.composite
def coinciding_sizes(draw):
    """Small sizes with one to three equalities forced, drawn from EQUALITIES."""
    heads = draw(st.sampled_from([2, 3, 4, 6]))
    kv_heads = draw(st.sampled_from([n for n in (1, 2, 3, 4, 6) if heads % n == 0]))
    d_k = draw(st.sampled_from([2, 4, 6, 8]))  # even, for RoPE
    batch, seq = draw(st.integers(2, 6)), draw(st.integers(2, 8))
    for equality in draw(
        st.lists(st.sampled_from(EQUALITIES), min_size=1, max_size=3, unique=True)
    ):
        left, right = equality.split(" == ")
        value = {"d_k": d_k, "heads": heads, "kv_heads": kv_heads, "seq": seq}[right]
        batch, seq = (value, seq) if left == "batch" else (batch, value)
    seq_k = seq + draw(st.integers(1, 4))
    channels = draw(st.sampled_from([1, 3, batch]))
    grid = (draw(st.sampled_from([2, 3, batch, seq])), draw(st.sampled_from([2, batch, seq])))
    patch = draw(st.sampled_from([2, 3]))
    return Sizes("drawn", batch, heads, seq, d_k, seq_k, kv_heads, channels, patch, grid)


@pytest.mark.parametrize("name", CORRECT)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=coinciding_sizes())
def test_correct_model_gives_no_finding_at_coinciding_sizes(name, sizes):
    model, args = CORRECT[name](sizes)
    found = findings(model, *args)
    assert found == [], f"{sizes}\n" + describe(found)
