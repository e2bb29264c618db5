"""Every rule of the registry has a bug test and a correct-counterpart test at the three size
settings; a new rule without them fails here, by name.

The tests are the zoo's (tests/bug_zoo.py, run by tests/test_invariants.py): each bug, in its
code styles, is found at the distinct, coincident and realistic sizes (`test_bug_is_found`),
and its fix, the same module built without the bug, gives no finding at those sizes
(`test_fixed_code_gives_no_finding`). RULE_BUGS says which zoo bugs each rule finds, and a
test here checks that the rule itself (not another one) yields the bug's kind on them.

A bug that is silent only where two sizes coincide (`contraction`: seq == d_k) fails loudly
at the other settings, and `test_bug_is_found` checks that error there; the rule that finds
the silent bug is held to the settings where it is silent.
"""

import contextlib
import dataclasses
import os
from collections import defaultdict
from functools import cache

import bug_zoo as zoo
import pytest
import test_invariants as invariants

from shapeguard import ShapeError, checks

pytestmark = pytest.mark.no_shapeguard  # the zoo's bugs warn on purpose

# Rule ("family.function") -> the zoo bugs ("bug-style", as test_invariants names them)
# on which that rule yields the bug's kind at every size setting where the bug is silent.
RULE_BUGS: dict[str, tuple[str, ...]] = {
    "contraction.einsum_axes": ("contraction-einsum",),
    "contraction.product_axes": ("contraction-tutorial_attn_v", "contraction-hf_eager_q_k"),
    "layout.mha_batch_first": ("mha_batch_first-mha", "mha_batch_first-encoder_layer"),
    "layout.product_layout": ("no_transpose-tutorial_matmul",),
    "layout.rotary_axis": ("rotary_axis-hf_rotate_half", "rotary_axis-llama_freqs_cis"),
    "layout.sdpa_layout": ("no_transpose-hf_sdpa", "no_transpose-timm_sdpa"),
    "mask_semantics.added_mask": ("mask_axis-hf_eager_additive",),
    "mask_semantics.check": (
        "mask_axis-tutorial",
        "mask_polarity-timm_sdpa_bool",
        "mask_direction-nanogpt",
        "causal_alignment-functional_sdpa",
    ),
    "regroup.regroup": ("carve-tutorial", "merge-hf_sdpa", "fold_order-einops_bmm"),
    "score_bias.added_to_scores": ("bias_constant-tutorial_alibi",),
    "score_bias.baddbmm_input": ("bias_constant-bloom_baddbmm",),
    "score_bias.sdpa_bias": ("bias_constant-sdpa_float_mask",),
    "softmax.softmax_over_keys": ("softmax_axis-tutorial", "softmax_axis-einops"),
    "tiling.mask_tiling": ("mask_repeat-mha_repeat", "mask_repeat-einops_repeat"),
}

# Rules with no bug test and counterpart at the three settings yet. This list only shrinks:
# a rule that gets its zoo bugs moves to RULE_BUGS, and an entry left behind fails.
UNTESTED: set[str] = {
    "cache.cache_grown_along",
    "cache.mask_key_length",
    "elementwise.arithmetic",  # `broadcast`: only at the rotary bug's loud sizes
    "elementwise.bool_mask_added",
    "elementwise.masked_fill",
    "elementwise.where",
    "flash.flash_contract",
    "heads_view.view",
    "mask_semantics.read_by_softmax",
    "matmul.baddbmm",
    "matmul.einsum_sizes",  # `einsum_dim`: only at the contraction bug's loud (distinct) sizes
    "matmul.linear_width",
    "matmul.products",  # `matmul_inner`: only at the contraction bug's loud (distinct) sizes
    "mha.mha_contract",
    "sdpa.sdpa_contract",
    "tp.dtensor_mixed",
    "tp.dtensor_mixed_elementwise",
    "tp.shard_axis_mismatch",
    "tp.shard_of_replicated",
    "tp.shard_of_replicated_elementwise",
    "tp.sharded_projection",
}

BUGS = {str(bug): bug for bug in invariants.BUGS}
SETTINGS = {sizes.name: sizes for sizes in zoo.SETTINGS}


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
        "the bug to tests/bug_zoo.py in two styles (tests/test_invariants.py BUGS runs it and "
        f"its fix at every setting) and name it in RULE_BUGS: {missing}"
    )
    stale = sorted((set(RULE_BUGS) | UNTESTED) - set(rules))
    assert not stale, f"not registered rules (drop them here): {stale}"
    both = sorted(set(RULE_BUGS) & UNTESTED)
    assert not both, f"tested now (drop them from UNTESTED): {both}"


@pytest.mark.parametrize("name", sorted(RULE_BUGS))
def test_the_named_bugs_are_the_zoos_and_of_the_rules_kinds(name):
    rule = registry()[name]
    for bug_id in RULE_BUGS[name]:
        assert bug_id in BUGS, f"{name}: no zoo bug {bug_id} in tests/test_invariants.py BUGS"
        kind = BUGS[bug_id].kind
        assert kind in rule.kinds, f"{name} does not declare {kind!r}, the kind of {bug_id}"


def _parametrized(test) -> dict[str, list]:
    return {mark.args[0]: list(mark.args[1]) for mark in test.pytestmark}


def test_the_zoo_runs_each_bug_and_its_fix_at_the_three_settings():
    """The three settings are what the issue asks for, and the zoo's two tests run every
    bug (found) and its fix (no finding) at each of them."""
    distinct, coincident, realistic = zoo.SETTINGS
    sizes = (distinct.batch, distinct.heads, distinct.seq, distinct.d_k)
    assert len(set(sizes)) == 4, f"distinct sizes coincide: {sizes}"
    assert coincident.batch == coincident.seq == coincident.heads == coincident.d_k
    assert (realistic.batch, realistic.heads, realistic.seq, realistic.d_k) == (4, 8, 64, 64)
    for test in (invariants.test_bug_is_found, invariants.test_fixed_code_gives_no_finding):
        axes = _parametrized(test)
        assert axes["bug"] == invariants.BUGS, test.__name__
        assert axes["sizes"] == list(zoo.SETTINGS), test.__name__


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


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("name", sorted(RULE_BUGS))
def test_the_rule_itself_finds_its_bugs(name, setting):
    sizes = SETTINGS[setting]
    silent = [bug_id for bug_id in RULE_BUGS[name] if BUGS[bug_id].silent(sizes)]
    for bug_id in RULE_BUGS[name]:
        if bug_id not in silent:
            assert BUGS[bug_id].loud, f"{bug_id} is neither silent nor loud at {setting} sizes"
    missed = defaultdict(list)
    for bug_id in silent:
        if (name, BUGS[bug_id].kind) not in _yields(bug_id, setting):
            missed[bug_id] = sorted(_yields(bug_id, setting))
    assert not missed, f"{name} does not find these at {setting} sizes (what did): {dict(missed)}"
