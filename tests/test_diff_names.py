"""The ports `shapeguard diff` is tested on (tests/diff_ports.py), and the naming of the
difference between a reference tensor and a port's (shapeguard/_diff/explain.py)."""

import diff_ports as dp
import pytest
import torch

from shapeguard._diff.explain import Pair, name_difference

SETTINGS = {s.name: s for s in dp.SETTINGS}
# Where each variant's first divergence is, in the order the forward computes them.
ORDER = ("cos", "q_proj", "q", "q_rot", "scores", "attn", "out")
FIRST = {
    "transpose": "scores",
    "head_grouping": "q",
    "rotary_pairing": "q_rot",
    "scale": "scores",
    "shift": "cos",
    "reverse": "q_proj",
    "roll": "q_proj",
    "mask_polarity": "attn",
    "mask_axis": "attn",
    "bias": "q_proj",
}


def agrees(a, b) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", SETTINGS)
def test_the_correct_port_matches_transformers_logits_at_float32_tolerance(name):
    s = SETTINGS[name]
    ref, port, ids = dp.build(dp.Setting(name, s.batch, s.heads, s.seq, s.head_dim, layers=2))
    with torch.no_grad():
        want, got = ref(ids).logits, port(ids)
    assert got.shape == (s.batch, s.seq, dp.VOCAB)
    assert (want - got).abs().max().item() < 1e-5
    ref_t, port_t = dp.ref_taps(ref, ids), dp.port_taps(port, ids)
    assert [k for k in ORDER if not agrees(ref_t[k], port_t[k])] == []


def test_the_weight_mapping_covers_every_transformers_weight():
    ref, port, _ = dp.build(SETTINGS["distinct"])
    mapped = {dp.port_name(n) for n in ref.state_dict()}
    assert mapped == set(port.state_dict())
    with pytest.raises(KeyError):
        dp.port_name("model.layers.0.self_attn.rotary.weight")


# The variants' bugs are on purpose; shapeguard's own trace flags some (the causal mask on
# the key axis), so these run untraced.
@pytest.mark.no_shapeguard
@pytest.mark.parametrize("style", dp.STYLES)
@pytest.mark.parametrize("variant", sorted(FIRST))
@pytest.mark.parametrize("name", SETTINGS)
def test_each_variant_first_diverges_where_its_difference_is(name, variant, style):
    ref, port, ids = dp.build(SETTINGS[name], variant, style)
    ref_t, port_t = dp.ref_taps(ref, ids), dp.port_taps(port, ids)
    first = next(k for k in ORDER if not agrees(ref_t[k], port_t[k]))
    assert first == FIRST[variant]


# -- naming the difference -----------------------------------------------------------------
# The tensor a variant's pair is read against, as the engine passes it upstream.
UPSTREAM = {"q_rot": "q", "attn": "scores"}


def the_pair(s, ref_t, port_t, key, *, axes=True, upstream=True):
    ups = ()
    if upstream and key in UPSTREAM:
        up = UPSTREAM[key]
        ups = (Pair(ref_t[up], port_t[up], f"layers.0 {up}", axes=dp.AXES[up]),)
    return Pair(
        ref_t[key],
        port_t[key],
        f"layers.0 {key}",
        axes=dp.AXES[key] if axes else (),
        upstream=ups,
        sizes={"heads": s.heads, "head_dim": s.head_dim, "d_model": s.d_model},
    )


def expected(variant, s):
    """(kind, phrases of the relation, phrases of the hint) for a variant at sizes s."""
    T, D, H, C = s.seq, s.head_dim, s.heads, s.d_model
    ratio = f"{(D / C) ** 0.5:.6g}"
    if s.name == "coincident":  # sqrt(head_dim / d_model) == 1/sqrt(head_dim) here
        scale_said = [f"port == ref * {ratio} everywhere", " or 1/head_dim", "at these sizes"]
        scale_fix = [f"multiply the port's scale by {1 / float(ratio):.6g} on the line"]
    else:
        scale_said = [f"port == ref * {ratio}", "scales by 1/sqrt(d_model) for 1/sqrt(head_dim)"]
        scale_fix = [
            f"multiply the port's scale by {1 / float(ratio):.6g} on the line that scales "
            "it (divide by sqrt(head_dim), not sqrt(d_model))"
        ]
    return {
        "transpose": (
            ["port == ref.permute(0, 1, 3, 2)", "(batch, heads, k_seq, q_seq) where the "
             "reference's are (batch, heads, q_seq, k_seq)", f"(sizes ({s.batch}, {H}, {T}, {T}))"],
            ["put q_seq, k_seq back", ".permute(0, 1, 3, 2)", "operands of a product"],
        ),
        "head_grouping": (
            [f"grouped (d h) where the reference's are (h d): heads {H}, head_dim {D} over {C}"],
            ["as (h d)", "x.view(B, T, heads, head_dim).transpose(1, 2)"],
        ),
        "rotary_pairing": (
            ["pairs rotary dims interleaved (GPT-J: dims 2i and 2i + 1) where the reference "
             f"pairs them half-split (NeoX: dims i and i + head_dim/2), head_dim {D}"],
            ["half-split", "x * cos + cat((-x2, x1), -1) * sin"],
        ),
        "scale": (scale_said, scale_fix),
        "shift": (
            [f"port[seq=t] == ref[seq=t + 1] for the {T - 1} positions both have (seq {T})",
             "one position ahead"],
            ["off by one", "arange(T), not arange(1, T + 1)", "table[:T], not table[1 : T + 1]"],
        ),
        "reverse": (
            [f"reversed along seq ({T}): port[seq=t] == ref[seq={T - 1}-t]"],
            ["remove the reversal of seq", ".flip(1)"],
        ),
        "roll": (
            [f"rolled by 1 along seq ({T}): port[seq=t] == ref[seq=(t - 1) mod {T}]"],
            ["without its un-roll", "torch.roll(x, -1, dims=1)"],
        ),
        "mask_polarity": (
            ["attends where the reference masks", "over (q_seq, k_seq) has the other polarity",
             f"({s.batch * H} rows the port's mask empties not compared)"],
            ["invert the port's mask (~mask)", "True where it is hidden for masked_fill"],
        ),
        "mask_axis": (
            ["the reference's transposed", "a mask over (k_seq, q_seq) used as (q_seq, k_seq)"],
            ["transpose the port's mask (.mT)", "tril for triu"],
        ),
        "bias": (
            [f"port == ref + b, b a vector over d_model ({C}) the same at every batch, seq"],
            ["drops the reference's bias", "bias=False", "F.linear without its bias"],
        ),
    }[variant]  # fmt: skip


def undone(difference, port):
    """The port's tensor with the hint's fix applied, where the hint gives it as an op."""
    undo = difference.detail.get("undo")
    if isinstance(undo, tuple) and undo and undo[0] == "flip":
        return port.flip(undo[1])
    if isinstance(undo, tuple) and undo and undo[0] == "roll":
        return torch.roll(port, undo[1], dims=undo[2])
    if difference.kind == "transpose":
        return port.permute(undo)
    if difference.kind == "scale":
        return port / difference.detail["ratio"]
    return None


@pytest.mark.no_shapeguard
@pytest.mark.parametrize("style", dp.STYLES)
@pytest.mark.parametrize("variant", sorted(FIRST))
@pytest.mark.parametrize("name", SETTINGS)
def test_each_variant_is_named_with_its_relation_and_the_fix(name, variant, style):
    s = SETTINGS[name]
    ref, port, ids = dp.build(s, variant, style)
    ref_t, port_t = dp.ref_taps(ref, ids), dp.port_taps(port, ids)
    key = FIRST[variant]
    found = name_difference(the_pair(s, ref_t, port_t, key))
    relation, hint = expected(variant, s)
    assert found is not None and found.kind == variant
    for phrase in relation:
        assert phrase in found.relation, (phrase, found.relation)
    for phrase in hint:
        assert phrase in found.hint, (phrase, found.hint)
    fixed = undone(found, port_t[key])
    if fixed is not None:  # the fix the hint gives brings the port back to the reference
        assert agrees(fixed, ref_t[key])
    assert found.residual < 1e-4


@pytest.mark.parametrize("name", SETTINGS)
def test_a_correct_port_has_nothing_to_name(name):
    s = SETTINGS[name]
    ref, port, ids = dp.build(s)
    ref_t, port_t = dp.ref_taps(ref, ids), dp.port_taps(port, ids)
    for key in ORDER:
        assert name_difference(the_pair(s, ref_t, port_t, key)) is None, key


def test_the_hints_fix_is_the_correct_ports_own_code():
    """The snippets the hints give are what the correct port (and transformers) run."""
    x = torch.randn(3, 7, 64)
    heads = x.view(3, 7, 4, 16).transpose(1, 2)  # the head_grouping hint, at B 3, T 7
    assert torch.equal(heads, dp.Attention(SETTINGS["distinct"], "correct", "a").split_heads(x))
    q, cos, sin = torch.randn(3, 4, 7, 16), torch.randn(1, 1, 7, 16), torch.randn(1, 1, 7, 16)
    x1, x2 = q.chunk(2, -1)  # the rotary_pairing hint
    assert torch.equal(q * cos + torch.cat((-x2, x1), -1) * sin, dp.rotate_half_split(q, cos, sin))


@pytest.mark.no_shapeguard
@pytest.mark.parametrize(
    "variant, key, drop",
    [
        ("head_grouping", "q", "axes"),  # heads and head_dim unnamed: no regrouping is tried
        ("rotary_pairing", "q_rot", "upstream"),  # no pre-rotary tensor: no rotation to fit
        ("mask_polarity", "attn", "upstream"),  # no scores: the mask is not read alone
        ("mask_axis", "attn", "upstream"),
    ],
)
def test_without_the_evidence_a_kind_needs_nothing_is_named(variant, key, drop):
    s = SETTINGS["distinct"]
    ref, port, ids = dp.build(s, variant, "a")
    ref_t, port_t = dp.ref_taps(ref, ids), dp.port_taps(port, ids)
    pair = the_pair(s, ref_t, port_t, key, axes=drop != "axes", upstream=drop != "upstream")
    assert name_difference(pair) is None


def unrelated(ref, how):
    g = torch.Generator().manual_seed(7)
    if how == "noise":
        return ref + 0.01 * torch.randn(ref.shape, generator=g)
    if how == "one element":
        out = ref.contiguous().clone()
        out.view(-1)[5] += 1.0
        return out
    if how == "random":
        return torch.randn(ref.shape, generator=g)
    if how == "a ratio per head":
        return ref * torch.linspace(0.5, 2.0, ref.shape[1]).view(1, -1, 1, 1)
    if how == "shuffled positions":
        return ref[:, :, torch.randperm(ref.shape[2], generator=g)]
    raise ValueError(how)


# The namer's candidates include an inverted and a transposed causal mask, which the
# plugin's open trace would flag (explain.name_difference says so): untraced.
@pytest.mark.no_shapeguard
@pytest.mark.parametrize(
    "how", ["noise", "one element", "random", "a ratio per head", "shuffled positions"]
)
@pytest.mark.parametrize("key", ["q", "scores", "attn"])
def test_unrelated_differences_are_not_named(key, how):
    s = SETTINGS["distinct"]
    ref, port, ids = dp.build(s)
    ref_t, port_t = dp.ref_taps(ref, ids), dp.port_taps(port, ids)
    port_t[key] = unrelated(ref_t[key], how)
    assert name_difference(the_pair(s, ref_t, port_t, key)) is None


def test_two_different_moves_that_both_explain_a_pair_name_nothing():
    # Along an axis [a, b, a, b]: reversed and rolled by one give the same tensor, but as
    # different moves of its elements; which the port did is not known.
    a, b = torch.randn(3, 5), torch.randn(3, 5)
    ref = torch.stack((a, b, a, b), 1)
    pair = Pair(ref, ref.flip(1), "x", axes=("batch", "seq", "d_model"))
    assert name_difference(pair) is None
    # The same move named two ways counts once: (d h) regrouping at heads == head_dim is
    # the transpose of heads and head_dim, and is named as the regrouping.
    q = torch.randn(2, 4, 3, 4)
    regrouped = q.transpose(1, 2).reshape(2, 3, 16).view(2, 3, 4, 4).permute(0, 3, 1, 2)
    found = name_difference(Pair(q, regrouped, "q", axes=dp.AXES["q"]))
    assert found is not None and found.kind == "head_grouping"


@pytest.mark.parametrize(
    "ref, port",
    [
        (torch.tensor(1.0), torch.tensor(2.0)),  # a ratio of two numbers is no evidence
        (torch.ones(3, 4, dtype=torch.bool).tril(), torch.ones(3, 4, dtype=torch.bool).triu()),
        (torch.randn(3, 4), torch.randn(4, 5)),
        (torch.randn(0, 4), torch.randn(0, 4)),
        (torch.randn(3, 4), torch.full((3, 4), float("nan"))),
        (torch.randn(3, 5, 4), torch.randn(3, 5, 4).bfloat16()),
        (torch.randn(2, 3, 2, 3, 2, 3), torch.randn(2, 3, 2, 3, 2, 3)),
        # a ramp shifted by one is also the ramp plus one: two kinds, no guess
        (torch.arange(12).view(3, 4), torch.arange(12).view(3, 4) + 1),
    ],
    ids=["0-d", "bool", "shapes", "empty", "nan", "bf16", "6-d", "ramp"],
)
def test_odd_pairs_name_nothing_and_never_crash(ref, port):
    assert name_difference(Pair(ref, port, "x", axes=tuple("abcdef"[: ref.dim()]))) is None


# The diff engine names an SDPA operand's axes by its contract: (batch, heads, query, head_dim).
ENGINE_AXES = {
    "q": ("batch", "heads", "query", "head_dim"),
    "q_rot": ("batch", "heads", "query", "d_k"),
}


@pytest.mark.no_shapeguard
@pytest.mark.parametrize("variant, key", [("head_grouping", "q"), ("rotary_pairing", "q_rot")])
def test_the_engines_axis_names_are_read_too(variant, key):
    s = SETTINGS["distinct"]
    ref, port, ids = dp.build(s, variant, "b")
    ref_t, port_t = dp.ref_taps(ref, ids), dp.port_taps(port, ids)
    pair = the_pair(s, ref_t, port_t, key)
    pair.axes = ENGINE_AXES[key]
    up = pair.upstream[0] if pair.upstream else None
    if up is not None:
        up.axes = ENGINE_AXES["q"]
    found = name_difference(pair)
    assert found is not None and found.kind == variant


@pytest.mark.no_shapeguard
@pytest.mark.parametrize("style", dp.STYLES)
@pytest.mark.parametrize("name", SETTINGS)
def test_a_scale_is_named_on_the_probabilities_alone(name, style):
    """The engine may see the scores agree (read before the port scales them) and the
    attention probabilities diverge: softmax(c * scores) is named from them alone."""
    s = SETTINGS[name]
    ref, port, ids = dp.build(s, "scale", style)
    ref_t, port_t = dp.ref_taps(ref, ids), dp.port_taps(port, ids)
    found = name_difference(the_pair(s, ref_t, port_t, "attn", upstream=False))
    ratio = (s.head_dim / s.d_model) ** 0.5
    assert found is not None and found.kind == "scale"
    assert f"port == softmax(scores * {ratio:.6g}) where ref == softmax(scores)" in found.relation
    assert f"multiply the port's scale by {1 / ratio:.6g}" in found.hint
    if name != "coincident":
        assert "(divide by sqrt(head_dim), not sqrt(d_model))" in found.hint


@pytest.mark.no_shapeguard
@pytest.mark.parametrize("variant", ["mask_polarity", "mask_axis"])
@pytest.mark.parametrize("name", SETTINGS)
def test_a_mask_is_named_when_the_upstream_scores_hold_each_sides_mask(name, variant):
    """transformers' softmax input holds its mask's fill (finfo.min) and the port's its
    own: the scores are read from whichever side has them."""
    s = SETTINGS[name]
    ref, port, ids = dp.build(s, variant, "a")
    ref_t, port_t = dp.ref_taps(ref, ids), dp.port_taps(port, ids)
    low = torch.finfo(torch.float32).min
    ref_t["scores"] = ref_t["scores"].masked_fill(ref_t["attn"] == 0, low)
    port_t["scores"] = port_t["scores"].masked_fill(port_t["attn"] == 0, low)
    found = name_difference(the_pair(s, ref_t, port_t, "attn"))
    assert found is not None and found.kind == variant


# At Q after rotary, as the engine sees it: axes by the SDPA operand's contract, and the
# projection's (batch, seq, heads * head_dim) output upstream, split (h d) on trial.
AFTER_ROTARY = {
    "head_grouping": ["grouped (d h) where the reference's are (h d)", "(seen after rotary)"],
    "rotary_pairing": [
        "pairs rotary dims interleaved",
        "where the reference pairs them half-split",
    ],
    "shift": ["by the reference's rotary angle for t + 1", "its rotary positions are one ahead"],
    "bias": ["port == rotary(x + b) where ref == rotary(x)", "the same at every axis 0 and query"],
}


@pytest.mark.no_shapeguard
@pytest.mark.parametrize("style", dp.STYLES)
@pytest.mark.parametrize("variant", sorted(AFTER_ROTARY))
@pytest.mark.parametrize("name", SETTINGS)
def test_differences_before_rotary_are_named_after_it(name, variant, style):
    s = SETTINGS[name]
    ref, port, ids = dp.build(s, variant, style)
    ref_t, port_t = dp.ref_taps(ref, ids), dp.port_taps(port, ids)
    projected = Pair(ref_t["q_proj"], port_t["q_proj"], "q_proj", axes=(None, None, None))
    pair = Pair(
        ref_t["q_rot"],
        port_t["q_rot"],
        "Q",
        "Q",
        axes=(None, None, "query", "head_dim"),
        upstream=(projected,),
        sizes={"heads": s.heads, "head_dim": s.head_dim, "d_model": s.d_model},
    )
    found = name_difference(pair)
    assert found is not None and found.kind == variant, found
    for phrase in AFTER_ROTARY[variant]:
        assert phrase in found.relation, (phrase, found.relation)
