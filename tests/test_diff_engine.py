"""shapeguard.diff: agreement of correct pairs, the first divergence of a port with a
deliberate difference (key, source line, axes), the weights report, and that the user's
state is left as it was."""

import inspect

import diff_models as dm
import pytest
import torch

import shapeguard

# (batch, heads, seq, d_k): pairwise distinct, coincident, realistic.
SIZES = {
    "distinct": (3, 4, 7, 16),
    "coincident": (4, 4, 4, 4),
    "realistic": (4, 8, 64, 64),
}


def _line(cls, marker: str) -> int:
    lines, first = inspect.getsourcelines(cls.forward)
    return first + next(i for i, text in enumerate(lines) if marker in text)


def _models(sizes, **port_options):
    batch, heads, seq, d_k = sizes
    torch.manual_seed(0)
    ref = dm.Attention(heads * d_k, heads)
    port = dm.Port(heads * d_k, heads, **port_options)
    x = torch.randn(batch, seq, heads * d_k)
    return ref, port, x


@pytest.mark.parametrize("setting", SIZES)
def test_a_correct_port_with_mapped_weights_agrees(setting):
    ref, port, x = _models(SIZES[setting])
    result = shapeguard.diff(ref, port, x, weights=dm.MAPPING)
    assert result.agree and result.first is None
    text = str(result)
    assert text.startswith("diff: Port against Attention agree: ")
    assert "weights: 8 tensors copied from the reference (8 by mapping)" in text
    # The port's modules are keyed under the reference's names, so Q, K, V, scores, attn,
    # context and every projection's output align.
    assert result.aligned == 11 and not result.port_only


@pytest.mark.parametrize("setting", SIZES)
def test_the_scale_bug_is_found_at_the_scores_with_both_lines(setting):
    ref, port, x = _models(SIZES[setting], scale_from_d_model=True)
    batch, heads, seq, d_k = SIZES[setting]
    result = shapeguard.diff(ref, port, x, weights=dm.MAPPING)
    assert not result.agree
    first = result.first
    assert first.key == "scores" and first.role == "scores"
    assert first.ref.site.endswith(f"diff_models.py:{_line(dm.Attention, 'REF_SOFTMAX')}")
    assert first.port.site.endswith(f"diff_models.py:{_line(dm.Port, 'PORT_SOFTMAX')}")
    assert first.port.source == "weights = torch.softmax(scores, dim=-1)  # PORT_SOFTMAX"
    # Every element is off by the ratio sqrt(d_model / d_k): all heads, positions diverge.
    along = first.along()
    assert f"query 0-{seq - 1} of {seq}, key 0-{seq - 1} of {seq}" in along
    assert first.upstream[:2] == ["K", "Q"]  # Q and K still agree: the product's scale
    text = str(result).splitlines()
    assert text[0].startswith("diff: ")
    assert text[1].startswith("  first divergence: scores (")
    assert text[3].lstrip().startswith("reference (root)")
    assert text[-1].strip().startswith("weights: 8 tensors copied")
    assert any(line.strip().startswith("hint: ") for line in text)


def test_copy_by_shape_in_module_order_is_reported():
    ref, port, x = _models(SIZES["distinct"])
    result = shapeguard.diff(ref, port, x)
    assert result.agree
    assert result.matched.counts() == {"mapping": 0, "name": 0, "shape": 8}
    assert result.matched.pairs[0] == ("q_proj.weight", "wq.weight", "shape")


def test_unmatched_parameters_are_listed():
    torch.manual_seed(0)
    ref = dm.Attention(64, 4)
    port = torch.nn.Sequential(torch.nn.Linear(64, 64))
    result = shapeguard.diff(ref, port, torch.randn(3, 7, 64), weights="copy")
    assert result.matched.port_unmatched == []
    assert len(result.matched.ref_unmatched) == 6
    assert "unmatched: 6 of the reference's (k_proj.weight, k_proj.bias, v_proj.weight" in str(
        result
    )


def test_a_bad_mapping_is_refused_with_the_names():
    ref, port, x = _models(SIZES["distinct"])
    with pytest.raises(ValueError, match="the port has no tensor 'nope'"):
        shapeguard.diff(ref, port, x, weights={"q_proj.weight": "nope"})


def test_the_users_state_is_unchanged():
    ref, port, x = _models(SIZES["distinct"], scale_from_d_model=True)
    port.train()
    before = {k: v.clone() for k, v in port.state_dict().items()}
    ref_before = {k: v.clone() for k, v in ref.state_dict().items()}
    rng = torch.get_rng_state()
    shapeguard.diff(ref, port, x, weights=dm.MAPPING)
    assert torch.equal(torch.get_rng_state(), rng)
    assert port.training and all(m.training for m in port.modules())
    assert all(torch.equal(before[k], v) for k, v in port.state_dict().items())
    assert all(torch.equal(ref_before[k], v) for k, v in ref.state_dict().items())


def test_sdpa_against_the_product_agrees_on_the_shared_roles():
    ref, _, x = _models(SIZES["distinct"])
    port = dm.SdpaAttention(64, 4)
    result = shapeguard.diff(ref, port, x)
    assert result.agree
    assert {"Q", "K", "V", "context"} <= set(result.flows["agree"])
    assert set(result.ref_only) == {"scores", "attn"}


def test_json_report_has_the_divergence():
    ref, port, x = _models(SIZES["distinct"], scale_from_d_model=True)
    data = shapeguard.diff(ref, port, x, weights=dm.MAPPING).as_json()
    assert data["schema"] == "shapeguard.diff/1" and data["agree"] is False
    assert data["first"]["key"] == "scores"
    assert data["first"]["axes"][2] == {
        "axis": 2, "name": "query", "size": 7, "diverging": 7, "runs": "0-6"
    }  # fmt: skip
    assert data["weights"]["pairs"][0] == {"ref": "q_proj.weight", "port": "wq.weight",
                                          "how": "mapping"}  # fmt: skip


def test_html_marks_the_divergence():
    from shapeguard._diff.html import render_diff_html

    ref, port, x = _models(SIZES["distinct"], scale_from_d_model=True)
    page = render_diff_html(shapeguard.diff(ref, port, x, weights=dm.MAPPING))
    marked = '<tr class="diverge"><td>scores</td><td>scores</td><td class="state">first'
    assert marked in page
    assert '<tr class="agree"><td>Q</td>' in page


class _Raising(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = dm.Attention(64, 4)

    def forward(self, x):
        self.inner(x)
        raise RuntimeError("the port's own error")


def test_a_forward_that_raises_leaves_no_hook_and_the_ports_weights():
    ref, _, x = _models(SIZES["distinct"])
    port = _Raising()
    port.train()
    before = {k: v.clone() for k, v in port.state_dict().items()}
    with pytest.raises(RuntimeError, match="the port's own error"):
        shapeguard.diff(ref, port, x)
    assert all(not m._forward_hooks for m in (*ref.modules(), *port.modules()))
    assert all(m.training for m in port.modules())
    assert all(torch.equal(before[k], v) for k, v in port.state_dict().items())


@pytest.mark.parametrize("setting", SIZES)
def test_three_backends_each_against_the_first(setting):
    batch, heads, seq, d_k = SIZES[setting]
    torch.manual_seed(0)
    model = dm.Switchable(heads * d_k, heads)
    x = torch.randn(batch, seq, heads * d_k)
    result = shapeguard.diff(model, None, x, backends=("eager", "sdpa", "d_model"))
    assert [r.port_name for r in result.results] == ["Switchable[sdpa]", "Switchable[d_model]"]
    assert result.results[0].agree and not result.results[1].agree and not result.agree
    assert result.first is result.results[1].first and result.first.key == "scores"
    lines = str(result).splitlines()
    assert lines[0] == "diff: 2 backends against Switchable[eager]: 1 agree, 1 diverge"
    assert lines[1].startswith("  Switchable[sdpa]: agrees (")
    assert lines[2].startswith("  Switchable[d_model]: diverges at scores: port == ref * ")
    # then the diverging pair's own report, in the house format
    assert "Switchable[d_model] against Switchable[eager]:" in lines
    assert any(line.startswith("  hint: multiply the port's scale by ") for line in lines)
    assert model.config._attn_implementation == "eager"  # switched back
    data = result.as_json()
    assert data["schema"] == "shapeguard.diff-set/1" and data["agree"] is False
    assert [p["port"] for p in data["pairs"]] == ["Switchable[sdpa]", "Switchable[d_model]"]


def test_three_backends_that_agree_and_one_backend_refused():
    from shapeguard._diff.engine import DiffOptionError

    torch.manual_seed(0)
    model = dm.Switchable(64, 4)
    x = torch.randn(3, 7, 64)
    result = shapeguard.diff(model, None, x, backends=("eager", "sdpa", "eager"))
    assert result.agree and result.first is None
    assert str(result).startswith("diff: 2 backends against Switchable[eager]: 2 agree, 0 diverge")
    with pytest.raises(DiffOptionError, match="give two or more"):
        shapeguard.diff(model, None, x, backends=("eager",))
