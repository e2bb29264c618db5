"""shapeguard.diff end to end: transformers' LlamaForCausalLM against the hand-written
port of tests/diff_ports.py, weights copied by its mapping. The correct port agrees at
the three size settings; each variant's first divergence is the tensor its difference
first changes, at layer 0, with the port's own line where an op made it, and all 20
variant x style differences are named."""

import pytest

import shapeguard

P = pytest.importorskip("tests.diff_ports")
pytest.importorskip("transformers")

# The first tensor each difference changes, as the engine keys it (layer 0's attention).
ATTN = "model.layers.0.self_attn"
FIRST = {
    ("transpose", "a"): f"{ATTN} Q",  # matmul(k, q^T): its first operand is k
    ("transpose", "b"): f"{ATTN} scores",  # an einsum is no product the engine reads
    ("head_grouping", "a"): f"{ATTN} Q",
    ("head_grouping", "b"): f"{ATTN} Q",
    ("rotary_pairing", "a"): f"{ATTN} Q",
    ("rotary_pairing", "b"): f"{ATTN} Q",
    ("scale", "a"): f"{ATTN} scores",
    ("scale", "b"): f"{ATTN} scores",
    ("shift", "a"): f"{ATTN} Q",
    ("shift", "b"): f"{ATTN} Q",
    ("reverse", "a"): f"{ATTN}.q_proj block",  # the port reorders x before its wq
    ("reverse", "b"): f"{ATTN}.q_proj block",
    ("roll", "a"): f"{ATTN}.q_proj block",
    ("roll", "b"): f"{ATTN}.q_proj block",
    ("mask_polarity", "a"): f"{ATTN} scores",
    ("mask_polarity", "b"): f"{ATTN} scores",
    ("mask_axis", "a"): f"{ATTN} scores",
    ("mask_axis", "b"): f"{ATTN} scores",
    ("bias", "a"): f"{ATTN}.q_proj block",
    ("bias", "b"): f"{ATTN} Q",  # F.linear without the bias: wq's module never runs
}
# Every variant x style is named by the catalogue (`name_difference`) on the engine's pair:
# the transpose from the site's operands (style a: the port's product read, its operands
# are the reference's swapped; style b: an einsum, its scores the reference's Q·Kᵀ
# transposed), the bias dropped by F.linear from the reference's own projection output.
# What each relation and hint must say, for the kinds read in a way of their own:
SAID = {
    ("transpose", "a"): (
        "diff: the port's query-key product takes its operands in the other order: port Q "
        "== ref K and port K == ref Q (sizes ",
        "hint: swap the operands of the port's query-key product on its line: "
        "q @ k.transpose(-2, -1)",
    ),
    ("transpose", "b"): (
        "diff: port scores == (ref Q · ref Kᵀ)ᵀ * ",
        "its scores the reference's transposed over (query, key)",
        "hint: swap the operands of the port's query-key product (the product whose scores "
        "the port's line above takes)",
    ),
    ("bias", "b"): (
        "diff: port == rotary(x + b) where ref == rotary(x), b a vector over heads x head_dim",
        "hint: the port's projection drops the reference's bias (nn.Linear(..., bias=False), "
        "or F.linear without its bias)",
    ),
}
SETTINGS = {s.name: s for s in P.SETTINGS}


def _diff(setting, variant="correct", style="a"):
    ref, port, ids = P.build(setting, variant, style)
    ours = port.state_dict()
    mapping = {n: P.port_name(n) for n in ref.state_dict() if P.port_name(n) in ours}
    return shapeguard.diff(ref, port, ids, weights=mapping), mapping


@pytest.mark.parametrize("setting", SETTINGS)
def test_the_correct_port_agrees(setting):
    result, mapping = _diff(SETTINGS[setting])
    assert result.agree, str(result)
    assert result.matched.counts()["mapping"] == len(mapping)
    assert not result.matched.port_unmatched
    # The port's modules are keyed under transformers' names: blocks.0.attn is layer 0's
    # self_attn, so Q, K, V, scores, attn, context and the module outputs align.
    assert f"{ATTN} Q" in result.flows["agree"] and f"{ATTN} attn" in result.flows["agree"]


@pytest.mark.parametrize("variant, style", list(FIRST))
@pytest.mark.parametrize("setting", ["distinct", "coincident"])
def test_each_difference_first_diverges_at_its_tensor(setting, variant, style):
    result, _ = _diff(SETTINGS[setting], variant, style)
    assert not result.agree
    first = result.first
    assert first.key == FIRST[variant, style], str(result)
    if not first.key.endswith("block"):
        assert "diff_ports.py:" in first.port.site and first.port.source
        assert "modeling_llama.py:" in first.ref.site
    assert str(result).startswith("diff: ")
    named = first.difference
    assert named is not None and named.kind == variant, str(result)
    assert f"  hint: {named.hint}" in str(result)
    assert str(result).startswith(f"diff: {named.relation}")
    for phrase in SAID.get((variant, style), ()):
        assert phrase in str(result), (phrase, str(result))


@pytest.mark.parametrize("variant, style", list(FIRST))
def test_realistic_sizes(variant, style):
    result, _ = _diff(SETTINGS["realistic"], variant, style)
    assert result.first.key == FIRST[variant, style]
    assert result.first.difference is not None and result.first.difference.kind == variant
    for phrase in SAID.get((variant, style), ()):
        assert phrase in str(result), (phrase, str(result))


def test_one_operand_replaced_is_no_swap():
    # port Q == ref K while port K is still ref K (K used twice, not the two swapped): the
    # operand order is not what changed, and nothing is claimed.
    import torch

    from shapeguard._diff.explain import Pair, name_difference

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(3, 4, 7, 16, generator=g), torch.randn(3, 4, 7, 16, generator=g)
    axes = ("batch", "heads", "query", "head_dim")
    assert name_difference(Pair(q, k, "Q", "Q", axes, site={"K": (k, k)})) is None
    swapped = name_difference(Pair(q, k, "Q", "Q", axes, site={"K": (k, q)}))
    assert swapped is not None and swapped.kind == "transpose"


def test_inside_an_open_trace_the_catalogues_candidates_are_not_flagged():
    # name_difference tries masks that are wrong on purpose; the engine runs it with checks
    # off, so a trace open around shapeguard.diff finds nothing of it.
    with shapeguard.trace() as trace:
        result, _ = _diff(SETTINGS["distinct"], "mask_polarity", "a")
    assert result.first.difference.kind == "mask_polarity"
    assert list(trace.findings) == []
