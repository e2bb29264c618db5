"""The ports `shapeguard diff` is tested on (tests/diff_ports.py), and the naming of the
difference between a reference tensor and a port's (shapeguard/_diff/explain.py)."""

import diff_ports as dp
import pytest
import torch

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
