"""Every rule of the registry has a bug test and a correct-counterpart test at the three size
settings; a new rule without them fails here, by name.

The bugs are the zoo's silent ones (tests/bug_zoo.py, run by tests/test_invariants.py: each
bug, in its code styles, is found at the distinct, coincident and realistic sizes by
`test_bug_is_found`, and its fix, the same module built without the bug, gives no finding
there by `test_fixed_code_gives_no_finding`), and those of tests/rule_cases.py, mostly
loud, which this module runs the same way (`test_case_is_found`, `test_fixed_case_is_clean`),
and the tensor-parallel ones of tests/tp_cases.py, on one rank of torch's fake process group
(`test_tp_case_is_found`, `test_fixed_tp_case_is_clean`).
RULE_BUGS says which bugs each rule finds, and `test_the_rule_itself_finds_its_bugs`
checks that the rule itself (not another one) yields the bug's kind on them.

A zoo bug that is silent only where two sizes coincide (`contraction`: seq == d_k) fails
loudly at the other settings, and `test_bug_is_found` checks that error there; the rule that
finds the silent bug is held to the settings where it is silent.
"""

import contextlib
import dataclasses
import os
import warnings
from collections import defaultdict
from collections.abc import Callable
from functools import cache
from pathlib import Path

import bug_zoo as zoo
import pytest
import rule_cases
import test_invariants as invariants
import torch
import tp_cases

import shapeguard
from shapeguard import ShapeError, ShapeWarning, checks
from shapeguard.distributed import fake_tp

pytestmark = pytest.mark.no_shapeguard  # the bugs warn and raise on purpose


# -- the bugs of tests/rule_cases.py ----------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
    """One bug of tests/rule_cases.py in one style, as test_invariants.Bug: make(sizes, bug) builds the module
    (bug=None: the fix) and its inputs; the finding has `kind` and a hint with one of `fix`."""

    name: str
    style: str
    make: Callable
    kind: str
    fix: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.name}-{self.style}"


def _of(factory, inputs):
    def make(s, bug=None):
        torch.manual_seed(0)
        return factory(s, bug), inputs(s)

    return make


def masked(masking):
    return _of(
        lambda s, bug: rule_cases.Masked(s.d_model, s.heads, masking, bug), invariants.padded
    )


def merged(project):
    return _of(
        lambda s, bug: rule_cases.Merged(s.d_model, s.heads, project, bug), invariants.x_only
    )


HELPER = _of(lambda s, bug: rule_cases.MaskedSoftmax(bug), rule_cases.scores_padded)
POSITIONED = _of(
    lambda s, bug: rule_cases.Positioned(s.d_model, s.heads, 2 * s.seq + 1, bug),
    invariants.x_only,
)
LATE_ROPE = _of(
    lambda s, bug: rule_cases.LateRope(s.heads, s.rope_d_k, 2 * s.seq + 1, bug), invariants.x_rope
)
MASKING = _of(lambda s, bug: rule_cases.RandomMasking(s.d_model, bug), invariants.x_only)
BIASED = _of(lambda s, bug: rule_cases.Biased(s.d_model, s.heads, bug), invariants.x_only)
GROUPED = _of(
    lambda s, bug: rule_cases.Grouped(s.d_model, s.heads, s.kv_heads, bug), invariants.x_only
)
CROSS = _of(lambda s, bug: rule_cases.CrossMHA(s.d_model, s.heads, bug), rule_cases.padded_memory)
DECODING = _of(lambda s, bug: rule_cases.Decoding(s.d_model, s.heads, bug), invariants.with_cache)
CACHED_STEP = _of(
    lambda s, bug: rule_cases.CachedStep(s.d_model, s.heads, bug), invariants.with_cache
)


def graph(style):
    return _of(
        lambda s, bug: rule_cases.GraphAttention(s.d_model, s.heads, style, bug),
        rule_cases.graph_inputs,
    )


FLASH = _of(lambda s, bug: rule_cases.Flash(s.d_model, s.heads, bug), invariants.x_only)
LEGACY_QKV = _of(
    lambda s, bug: rule_cases.LegacyQKV(s.d_model, s.heads, bug), rule_cases.feature_map
)
DENSE_GAT = _of(lambda s, bug: rule_cases.DenseGAT(s.d_model, s.heads, bug), rule_cases.graph)
QUERIES = _of(
    lambda s, bug: rule_cases.ObjectQueries(s.d_model, s.heads, s.seq, bug), rule_cases.feature_map
)


def latents(style):
    return _of(
        lambda s, bug: rule_cases.Latents(s.d_model, s.heads, s.batch, style, bug),
        invariants.x_only,
    )


DEFORM_WEIGHTS = _of(
    lambda s, bug: rule_cases.DeformWeights(s.d_model, s.heads, bug), invariants.x_only
)
JOINT = _of(
    lambda s, bug: rule_cases.JointSplit(s.d_model, s.heads, bug), rule_cases.image_and_text
)
FLEX = _of(
    lambda s, bug: rule_cases.Flex(s.d_model, s.heads, 2 * s.seq + 1, bug), invariants.x_only
)


def reaching(style, inputs=rule_cases.left_padded_embeds):
    def build(s, bug):
        window = rule_cases.reach_window(s) if style == "window" else None
        return rule_cases.Reaching(s.d_model, s.heads, style, window, bug)

    return _of(build, inputs)


CASES = [
    Case("mask_not_bool", "masked_fill", masked("masked_fill"), "mask_dtype", ("mask == 0",)),
    Case("mask_not_bool", "where", masked("where"), "mask_dtype", ("mask == 0",)),
    Case("mask_not_bool", "added", masked("added"), "mask_dtype", ("masked_fill",)),
    Case("mask_polarity", "masked_softmax", HELPER, "mask_polarity", ("pass ~hide",)),
    Case("project_heads", "linear", merged("linear"), "linear_in_features", ("nn.Linear(",)),
    Case("project_heads", "matmul", merged("matmul"), "matmul_inner", ("second-to-last",)),
    Case("project_heads", "einsum", merged("einsum"), "einsum_dim", ("agree on the size",)),
    Case("view_transposed", "linear", merged("linear"), "noncontiguous_view", (".contiguous().view(",)),
    Case("unsplit_qkv", "linear", merged("linear"), "view_numel", ("head count and head size",)),
    Case("positions_unsliced", "learned", POSITIONED, "broadcast", ("equal or one of them 1",)),
    Case("rope_late", "rotate_half", LATE_ROPE, "rotary_axis", ("before the heads transpose",)),
    Case("gather_axis", "mae", MASKING, "gather_axis", ("dim=1",)),
    Case("bias_per_head", "baddbmm", BIASED, "broadcast", ("must broadcast to [batch, n, p]",)),
    Case("kv_heads", "sdpa", GROUPED, "sdpa_heads", ("enable_gqa=True",)),
    Case("memory_mask", "mha", CROSS, "mha_key_padding_mask", ("[batch, seq_k]",)),
    Case("cache_axis", "cat", DECODING, "cache_axis", ("along the sequence axis",)),
    Case("mask_new_only", "sdpa", DECODING, "mask_cache_length", ("cached + new keys",)),
    Case("block_mask_reused", "flex", FLEX, "block_mask_shape", ("create_block_mask(",)),
    Case("aggregation_axis", "legacy_einsum", LEGACY_QKV, "aggregation_axis", ("'bts,bcs->bct'",)),
    Case("aggregation_axis", "gat_matmul", DENSE_GAT, "aggregation_axis", ("drop the transpose",)),
    Case("aggregation_axis", "deform_sum", DEFORM_WEIGHTS, "aggregation_axis", ("softmax over only",)),
    Case("segment_slice", "joint_split", JOINT, "segment_slice", ("slice by the part you mean",)),
    Case("reach", "padded_key", reaching("padded_key"), "reach_padded_key", ("hide the padded keys",)),
    Case("reach", "future", reaching("future"), "reach_future", ("keys <= query",)),
    Case("reach", "window", reaching("window", rule_cases.unpadded_embeds), "reach_window", ("kv > q - ",)),
    Case("reach", "documents", reaching("documents", rule_cases.packed_embeds), "reach_documents", ("block-diagonal",)),
    Case("reach", "decode", CACHED_STEP, "reach_decode", ("restart at 0",)),
    Case("edge_softmax", "index_add", graph("index_add"), "edge_weights_other_side", ("group the softmax by",)),
    Case("edge_softmax", "scatter_add", graph("scatter_add"), "edge_weights_other_side", ("group the softmax by",)),
    Case("latents_axis", "einops", latents("einops"), "misaligned_axes", ("the axis of q under 'b'",)),
    Case("latents_axis", "expand", latents("expand"), "misaligned_axes", ("the axis of q under 'b'",)),
    Case("queries_batch", "mha", QUERIES, "misaligned_axes", ("repeat(1, B, 1)",)),
]  # fmt: skip

# Rule ("family.function") -> the bugs ("bug-style": test_invariants.BUGS or CASES) on
# which that rule yields the bug's kind at every size setting where the bug is silent.
RULE_BUGS: dict[str, tuple[str, ...]] = {
    "aggregation.weights_einsum": ("aggregation_axis-legacy_einsum",),
    "alignment.letter_pairs_a_parameter": ("latents_axis-einops", "latents_axis-expand"),
    "alignment.parameter_as_batch": ("queries_batch-mha",),
    "aggregation.weights_product": ("aggregation_axis-gat_matmul",),
    "aggregation.weights_sum": ("aggregation_axis-deform_sum",),
    "cache.cache_grown_along": ("cache_axis-cat",),
    "cache.mask_key_length": ("mask_new_only-sdpa",),
    "concat.cat_of_other_positions": ("cat_axis-joint_bshd", "cat_axis-joint_bhsd"),
    "contraction.einsum_axes": ("contraction-einsum",),
    "contraction.product_axes": ("contraction-tutorial_attn_v", "contraction-hf_eager_q_k"),
    "flex.block_mask_fits": ("block_mask_reused-flex",),
    "graph.summed_into_other_side": ("edge_softmax-index_add", "edge_softmax-scatter_add"),
    "elementwise.arithmetic": ("positions_unsliced-learned",),
    "elementwise.bool_mask_added": ("mask_not_bool-added",),
    "elementwise.masked_fill": ("mask_not_bool-masked_fill",),
    "elementwise.where": ("mask_not_bool-where",),
    "heads_view.view": ("view_transposed-linear", "unsplit_qkv-linear"),
    "layout.gather_axis": ("gather_axis-mae",),
    "layout.mha_batch_first": ("mha_batch_first-mha", "mha_batch_first-encoder_layer"),
    "layout.product_layout": ("no_transpose-tutorial_matmul",),
    "layout.rotary_axis": (
        "rotary_axis-hf_rotate_half",
        "rotary_axis-llama_freqs_cis",
        "rope_late-rotate_half",
    ),
    "layout.sdpa_layout": ("no_transpose-hf_sdpa", "no_transpose-timm_sdpa"),
    "mask_semantics.added_mask": ("mask_axis-hf_eager_additive",),
    "mask_semantics.check": (
        "mask_axis-tutorial",
        "mask_polarity-timm_sdpa_bool",
        "mask_direction-nanogpt",
        "causal_alignment-functional_sdpa",
    ),
    "mask_semantics.read_by_softmax": ("mask_polarity-masked_softmax",),
    "matmul.baddbmm": ("bias_per_head-baddbmm",),
    "matmul.einsum_sizes": ("project_heads-einsum",),
    "matmul.linear_width": ("project_heads-linear",),
    "matmul.products": ("project_heads-matmul",),
    "mha.mha_contract": ("memory_mask-mha",),
    "reach.attention_reach": (
        "reach-padded_key",
        "reach-future",
        "reach-window",
        "reach-documents",
        "reach-decode",
    ),
    "regroup.regroup": ("carve-tutorial", "merge-hf_sdpa", "fold_order-einops_bmm"),
    "score_bias.added_to_scores": ("bias_constant-tutorial_alibi",),
    "score_bias.baddbmm_input": ("bias_constant-bloom_baddbmm",),
    "score_bias.sdpa_bias": ("bias_constant-sdpa_float_mask",),
    "sdpa.sdpa_contract": ("kv_heads-sdpa",),
    "softmax.softmax_over_keys": ("softmax_axis-tutorial", "softmax_axis-einops"),
    "tiling.mask_tiling": ("mask_repeat-mha_repeat", "mask_repeat-einops_repeat"),
    "tiling.mask_tiling_order": ("mask_repeat-einops_fill", "mask_repeat-bmm_fill"),
    "tp.dtensor_mixed": ("plain_operand-matmul",),
    "tp.dtensor_mixed_elementwise": ("plain_operand-mul",),
    "tp.shard_axis_mismatch": ("gather_other_axis-attention",),
    "tp.shard_of_replicated": ("replicated_as_shard-norm",),
    "tp.shard_of_replicated_elementwise": ("replicated_as_shard-gate",),
    "tp.sharded_projection": ("tp_too_wide-kv_heads",),
    "segments.joined_slice": ("segment_slice-joint_split",),
}

# Rules with no bug test and counterpart at the three settings yet. This list only shrinks:
# a rule that gets its bugs moves to RULE_BUGS, and an entry left behind fails.
UNTESTED: set[str] = {
    # layout_bshd is not found at the coincident sizes (test_flash_layout_at_every_setting)
    "flash.flash_contract",
    # xformers' kernel has no CPU operator, so a fixed call cannot run here and xformers is
    # optional: its bugs and fixed calls at the three settings are in tests/test_reach_xformers.py
    # (the check before the call, the kernel's own failure unchanged), run where it is installed.
    "xformers.xformers_contract",
}

BUGS = {str(bug): bug for bug in invariants.BUGS}
OWN = {str(case): case for case in [*CASES, *tp_cases.CASES]}
SETTINGS = {sizes.name: sizes for sizes in zoo.SETTINGS}
SETTING = pytest.mark.parametrize("sizes", zoo.SETTINGS, ids=lambda s: s.name)


def rule_id(r: checks.Rule) -> str:
    return f"{r.family}.{r.check.__qualname__}"


def registry() -> dict[str, checks.Rule]:
    checks._load()
    return {rule_id(r): r for r in checks._RULES}


def test_every_rule_has_its_bug_tests():
    rules = registry()
    missing = sorted(set(rules) - set(RULE_BUGS) - UNTESTED)
    assert not missing, (
        "rules without a bug test and a correct counterpart at the three size settings: add "
        "a silent bug to tests/bug_zoo.py in two styles (tests/test_invariants.py BUGS), a "
        "loud one to tests/rule_cases.py (CASES here), or a tensor-parallel one to "
        "tests/tp_cases.py (its CASES), and name it in RULE_BUGS: "
        f"{missing}"
    )
    stale = sorted((set(RULE_BUGS) | UNTESTED) - set(rules))
    assert not stale, f"not registered rules (drop them here): {stale}"
    both = sorted(set(RULE_BUGS) & UNTESTED)
    assert not both, f"tested now (drop them from UNTESTED): {both}"


@pytest.mark.parametrize("name", sorted(RULE_BUGS))
def test_the_named_bugs_exist_and_are_of_the_rules_kinds(name):
    rule = registry()[name]
    for bug_id in RULE_BUGS[name]:
        bug = BUGS.get(bug_id) or OWN.get(bug_id)
        assert bug is not None, f"{name}: no bug {bug_id} in test_invariants.BUGS nor CASES"
        assert bug.kind in rule.kinds, f"{name} does not declare {bug.kind!r} ({bug_id})"


def _parametrized(test) -> dict[str, list]:
    return {mark.args[0]: list(mark.args[1]) for mark in test.pytestmark}


def test_the_three_settings_run_every_bug_and_its_fix():
    """The three settings are what they say, and the zoo's two tests, like this module's,
    run every bug (found) and its fix (no finding) at each of them."""
    distinct, coincident, realistic = zoo.SETTINGS
    sizes = (distinct.batch, distinct.heads, distinct.seq, distinct.d_k)
    assert len(set(sizes)) == 4, f"distinct sizes coincide: {sizes}"
    assert coincident.batch == coincident.seq == coincident.heads == coincident.d_k
    assert (realistic.batch, realistic.heads, realistic.seq, realistic.d_k) == (4, 8, 64, 64)
    for test in (invariants.test_bug_is_found, invariants.test_fixed_code_gives_no_finding):
        axes = _parametrized(test)
        assert axes["bug"] == invariants.BUGS, test.__name__
        assert axes["sizes"] == list(zoo.SETTINGS), test.__name__
    for test, cases in (
        (test_case_is_found, CASES),
        (test_fixed_case_is_clean, CASES),
        (test_tp_case_is_found, tp_cases.CASES),
        (test_fixed_tp_case_is_clean, tp_cases.CASES),
    ):
        axes = _parametrized(test)
        assert axes["case"] == cases and axes["sizes"] == list(zoo.SETTINGS), test.__name__


# -- the bugs are found, their fixes clean --------------------------------------------------
def outcome(model, args) -> list:
    """The ShapeError a traced forward raises, or the findings it records (raise mode)."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", ShapeWarning)
        try:
            trace = shapeguard.trace(model, *args)
        except ShapeError as error:
            return [error]
    return list(trace.findings)


def marked_lines(module) -> dict[str, set[int]]:
    """Bug name -> the lines of `module`'s file marked `# <- name`."""
    marked = defaultdict(set)
    for number, line in enumerate(Path(module.__file__).read_text().splitlines(), 1):
        if "# <- " in line:
            marked[line.rsplit("# <- ", 1)[1].strip()].add(number)
    return marked


def assert_at_marked_line(finding, module, marked: dict[str, set[int]], name: str) -> None:
    path, _, line = finding.location.rpartition(":")
    assert Path(path).name == Path(module.__file__).name, finding.location
    assert int(line) in marked[name], finding.location


MARKED = marked_lines(rule_cases)


@SETTING
@pytest.mark.parametrize("case", CASES, ids=str)
def test_case_is_found(case, sizes):
    found = outcome(*case.make(sizes, case.name))
    assert [f.kind for f in found] == [case.kind], [str(f) for f in found]
    (finding,) = found
    assert any(fix in finding.hint for fix in case.fix), finding.hint
    assert_at_marked_line(finding, rule_cases, MARKED, case.name)


@SETTING
@pytest.mark.parametrize("case", CASES, ids=str)
def test_fixed_case_is_clean(case, sizes):
    assert outcome(*case.make(sizes, None)) == []


def test_the_cases_cover_each_bug_with_marked_lines():
    assert {case.name for case in CASES} <= set(MARKED)
    assert {case.name for case in tp_cases.CASES} <= set(TP_MARKED)
    assert len(OWN) == len(CASES) + len(tp_cases.CASES)


# -- the tensor-parallel bugs of tests/tp_cases.py, on one rank of torch's fake process group
TP_MARKED = marked_lines(tp_cases)


def tp_outcome(case: tp_cases.TPCase, sizes, bug) -> list:
    """`outcome` of the case's module (bug=None: the fix), parallelized on a fake mesh."""
    torch.manual_seed(0)
    with fake_tp(case.degree(sizes, bug)) as mesh:
        return outcome(*case.make(sizes, bug, mesh))


@SETTING
@pytest.mark.parametrize("case", tp_cases.CASES, ids=str)
def test_tp_case_is_found(case, sizes):
    found = tp_outcome(case, sizes, case.name)
    assert [f.kind for f in found] == [case.kind], [str(f) for f in found]
    (finding,) = found
    for part in case.says(sizes):  # the message's first line, of an error or a warning
        assert part in finding.relation, finding.relation
    assert case.fix in finding.hint, finding.hint
    assert_at_marked_line(finding, tp_cases, TP_MARKED, case.name)


@SETTING
@pytest.mark.parametrize("case", tp_cases.CASES, ids=str)
def test_fixed_tp_case_is_clean(case, sizes):
    assert tp_outcome(case, sizes, None) == []


# flash_attention's contract reads the layout from sizes: with batch == seq == heads it takes
# [batch, heads, seq, d_k] for [batch, seq, heads, d_k], and the bug goes unseen.
@pytest.mark.parametrize(
    "sizes",
    [
        pytest.param(s, marks=pytest.mark.xfail(strict=True, reason="layout read from sizes"))
        if s is zoo.COINCIDENT
        else s
        for s in zoo.SETTINGS
    ],
    ids=lambda s: s.name,
)
def test_flash_layout_at_every_setting(sizes):
    found = outcome(*FLASH(sizes, "flash_layout"))
    assert [f.kind for f in found] == ["layout_bshd"], [str(f) for f in found]
    assert outcome(*FLASH(sizes, None)) == []


# -- each rule finds its own bugs -----------------------------------------------------------
@cache
def _yields(bug_id: str, setting: str) -> frozenset[tuple[str, str]]:
    """(rule, kind) of every violation a rule yields while the bug runs at these sizes."""
    seen: set[tuple[str, str]] = set()

    def recording(r: checks.Rule) -> checks.Rule:
        def check(call):
            for violation in r.check(call):
                seen.add((rule_id(r), violation.kind))
                yield violation

        check.__module__, check.__qualname__ = r.check.__module__, r.check.__qualname__
        return dataclasses.replace(r, check=check)

    checks._load()
    original = list(checks._RULES)
    replay = os.environ.get("SHAPEGUARD_REPLAY")
    # Every op through the rules: a replayed step would reuse an earlier verdict.
    os.environ["SHAPEGUARD_REPLAY"] = "0"
    checks._RULES[:] = [recording(r) for r in original]
    checks._BY_SPELLING = checks._SINGLE_PROCESS = None
    try:
        case = OWN.get(bug_id)
        if isinstance(case, tp_cases.TPCase):
            tp_outcome(case, SETTINGS[setting], case.name)
        elif case is not None:
            outcome(*case.make(SETTINGS[setting], case.name))
        else:
            model, args = BUGS[bug_id].make(SETTINGS[setting], BUGS[bug_id].name)
            with contextlib.suppress(ShapeError):  # a loud bug at these sizes
                invariants.findings(model, *args)
    finally:
        checks._RULES[:] = original
        checks._BY_SPELLING = checks._SINGLE_PROCESS = None
        if replay is None:
            del os.environ["SHAPEGUARD_REPLAY"]
        else:
            os.environ["SHAPEGUARD_REPLAY"] = replay
    return frozenset(seen)


def _silent(bug_id: str, sizes) -> bool:
    return bug_id in OWN or BUGS[bug_id].silent(sizes)


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("name", sorted(RULE_BUGS))
def test_the_rule_itself_finds_its_bugs(name, setting):
    sizes = SETTINGS[setting]
    for bug_id in RULE_BUGS[name]:
        if not _silent(bug_id, sizes):
            assert BUGS[bug_id].loud, f"{bug_id} is neither silent nor loud at {setting} sizes"
    missed = defaultdict(list)
    for bug_id in RULE_BUGS[name]:
        kind = (OWN.get(bug_id) or BUGS[bug_id]).kind
        if _silent(bug_id, sizes) and (name, kind) not in _yields(bug_id, setting):
            missed[bug_id] = sorted(_yields(bug_id, setting))
    assert not missed, f"{name} does not find these at {setting} sizes (what did): {dict(missed)}"
