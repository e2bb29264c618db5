"""Each pre-flight check catches its bug before torch raises, on CPU and on the meta device,
and names it in the user's terms."""

import pytest
import torch
import torch.nn.functional as F
from attention_models import DK, SK, SQ, B, CrossAttention, D, GQAttention, H, HandAttention
from torch import nn

import shapeguard

pytestmark = pytest.mark.no_shapeguard  # these tests trigger violations on purpose

DEVICES = ["cpu", "meta"]


def sdpa(q, k, v, **kwargs):
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def qkv(device):
    q = torch.randn(B, H, SQ, DK, device=device)
    k = torch.randn(B, H, SK, DK, device=device)
    v = torch.randn(B, H, SK, DK, device=device)
    return q, k, v


def _x(device, d=D, seq=SQ):
    return torch.randn(B, seq, d, device=device)


# (id, make(device) -> (callable, args, kwargs), kind, substrings of the message)
CASES = [
    (
        "k_not_transposed",
        lambda dev: (HandAttention(bug="k_not_transposed").to(dev), (_x(dev),), {}),
        "matmul_inner",
        [
            "scores = Q @ K: Q.d_k (11) != K.seq (5)",
            "in  HandAttention at tests/attention_models.py:",
            "scores = torch.matmul(Q, K) / math.sqrt(self.d_k)",
            "Q      [batch=2, heads=3, seq=5, d_k=11]",
            "hint: K was not transposed: use Q @ K.transpose(-2, -1)",
        ],
    ),
    (
        "padding_mask_masked_fill",
        lambda dev: (HandAttention().to(dev), (_x(dev),), {"mask": torch.ones(B, SQ, device=dev)}),
        "mask_broadcast",
        [
            "scores.masked_fill(mask == 0, ...): scores.seq_q (5) and (mask == 0).batch (2) do not broadcast",
            "mask == 0  [batch=2, seq=5] bool",
            "hint: mask is a [batch, seq_k] padding mask: use mask[:, None, None, :]",
        ],
    ),
    (
        "masked_fill_float_mask",
        lambda dev: (
            lambda s, m: s.masked_fill(m, -1e9),
            (torch.randn(B, H, SQ, SK, device=dev), torch.ones(B, 1, SQ, SK, device=dev)),
            {},
        ),
        "mask_dtype",
        ["s.masked_fill(m, ...): m is float32, masked_fill wants bool", "hint: pass a bool mask"],
    ),
    (
        "wrong_linear_width",
        lambda dev: (
            CrossAttention(bug="wrong_linear_width").to(dev),
            (_x(dev), _x(dev, seq=SK)),
            {},
        ),
        "linear_in_features",
        [
            "k_proj = Linear(in_features=37) got memory with d_model=33",
            "in  k_proj (Linear) at tests/attention_models.py:",
            "memory  [batch=2, seq_k=7, d_model=33] float32",
            "k_proj  Linear(in_features=37, out_features=33)",
            "mat1 and mat2 shapes cannot be multiplied (14x33 and 37x33)",
            "build k_proj as nn.Linear(33, 33)",
        ],
    ),
    (
        "gqa_without_repeat",
        lambda dev: (GQAttention(bug="no_repeat_kv").to(dev), (_x(dev, d=66),), {}),
        "matmul_batch",
        [
            "query_states.heads (6) != key_states^T.kv_heads (3) and neither is 1",
            "repeat the kv heads first, e.g. k.repeat_interleave(2, dim=1)",
        ],
    ),
    (
        "bmm_batch",
        lambda dev: (
            torch.bmm,
            (torch.randn(6, SQ, DK, device=dev), torch.randn(4, DK, SK, device=dev)),
            {},
        ),
        "matmul_batch",
        ["(6) != ", "(4)", "bmm does not broadcast its batch axis"],
    ),
    (
        "einsum",
        lambda dev: (
            lambda q, k: torch.einsum("bhqd,bhkd->bhqk", q, k),
            (torch.randn(B, H, SQ, DK, device=dev), torch.randn(B, H, SK, DK + 2, device=dev)),
            {},
        ),
        "einsum_dim",
        ["einsum 'bhqd,bhkd->bhqk': 'd' is 11 in q (axis 3) but 13 in k (axis 3)"],
    ),
    (
        "view_numel",
        lambda dev: (lambda x: x.view(B, SQ, 4, -1), (_x(dev),), {}),
        "view_numel",
        [
            "x.view(2, 5, 4, -1): x has 330 elements; cannot regroup [33] as [4, -1]",
            "shape '[2, 5, 4, -1]' is invalid for input of size 330",
        ],
    ),
    (
        "view_after_transpose",
        lambda dev: (HandAttention(bug="view_after_transpose").to(dev), (_x(dev),), {}),
        "noncontiguous_view",
        [
            "context.view(2, -1, 33): context is not contiguous (it comes from transpose) and "
            "view cannot merge heads and d_k",
            "context  [batch=2, seq_q=5, heads=3, d_k=11] float32",
            "hint: use context.contiguous().view(...) or context.reshape(...)",
        ],
    ),
    (
        "sdpa_kv_seq",
        lambda dev: (CrossAttention(bug="kv_seq").to(dev), (_x(dev), _x(dev, seq=SK)), {}),
        "sdpa_kv_seq",
        [
            "scaled_dot_product_attention: k.seq_k (7) != v.seq_k (6)",
            "accepts this silently",
        ],
    ),
    (
        "sdpa_head_dim",
        lambda dev: (
            sdpa,
            (qkv(dev)[0], torch.randn(B, H, SK, DK + 1, device=dev), qkv(dev)[2]),
            {},
        ),
        "sdpa_head_dim",
        ["scaled_dot_product_attention: q.dim -1 (11) != k.dim -1 (12)"],
    ),
    (
        "sdpa_heads",
        lambda dev: (sdpa, (qkv(dev)[0], qkv(dev)[1][:, :1], qkv(dev)[2][:, :1]), {}),
        "sdpa_heads",
        ["q.heads (3) != k.heads (1) and enable_gqa is off", "pass enable_gqa=True"],
    ),
    (
        "sdpa_gqa",
        lambda dev: (
            sdpa,
            (
                torch.randn(B, 5, SQ, DK, device=dev),
                torch.randn(B, 3, SK, DK, device=dev),
                torch.randn(B, 3, SK, DK, device=dev),
            ),
            {"enable_gqa": True},
        ),
        "sdpa_gqa",
        ["q.heads (5) is not a multiple of k.heads (3)"],
    ),
    (
        "sdpa_batch",
        lambda dev: (sdpa, (qkv(dev)[0], qkv(dev)[1][:1], qkv(dev)[2][:1]), {}),
        "sdpa_batch",
        ["batch axes differ: q [2], k [1], v [1]"],
    ),
    (
        "sdpa_mask_and_causal",
        lambda dev: (
            sdpa,
            qkv(dev),
            {"attn_mask": torch.ones(SQ, SK, dtype=torch.bool, device=dev), "is_causal": True},
        ),
        "sdpa_mask_causal",
        ["attn_mask and is_causal=True are both set"],
    ),
    (
        "sdpa_int_mask",
        lambda dev: (
            sdpa,
            qkv(dev),
            {"attn_mask": torch.ones(B, 1, SQ, SK, dtype=torch.long, device=dev)},
        ),
        "mask_dtype",
        ["attn_mask is int64; SDPA wants bool (True = attend) or float32", "attn_mask.bool()"],
    ),
    (
        "sdpa_padding_mask",
        lambda dev: (
            CrossAttention(bug="padding_mask_unexpanded").to(dev),
            (_x(dev), _x(dev, seq=SK), torch.ones(B, SK, dtype=torch.bool, device=dev)),
            {},
        ),
        "mask_broadcast",
        [
            "attn_mask [2, 7] does not broadcast to [batch=2, heads=3, seq_q=5, seq_k=7]",
            "use attn_mask[:, None, None, :]",
        ],
    ),
    (
        "mha_key_padding_mask_batch_first",
        lambda dev: (
            nn.MultiheadAttention(D, H).to(dev),
            (_x(dev), _x(dev), _x(dev)),
            {"key_padding_mask": torch.zeros(B, SQ, dtype=torch.bool, device=dev)},
        ),
        "mha_key_padding_mask",
        [
            "MultiheadAttention (batch_first=False): key_padding_mask [2, 5] != [batch=5, seq_k=2]",
            "build MultiheadAttention(..., batch_first=True)",
        ],
    ),
    (
        "mha_attn_mask_per_batch",
        lambda dev: (
            nn.MultiheadAttention(D, H, batch_first=True).to(dev),
            (_x(dev), _x(dev, seq=SK), _x(dev, seq=SK)),
            {"attn_mask": torch.zeros(B, SQ, SK, dtype=torch.bool, device=dev)},
        ),
        "mha_attn_mask",
        [
            "attn_mask [2, 5, 7] is neither [seq_q=5, seq_k=7] nor [batch*heads=6, seq_q=5, seq_k=7]",
            "mask.repeat_interleave(3, dim=0)",
        ],
    ),
    (
        "mha_embed",
        lambda dev: (
            nn.MultiheadAttention(D, H, batch_first=True).to(dev),
            (_x(dev, d=D + 1), _x(dev, d=D + 1), _x(dev, d=D + 1)),
            {},
        ),
        "mha_embed",
        ["query.embed_dim (34) != embed_dim (33)"],
    ),
    (
        "head_split_view",
        lambda dev: (lambda x: x.view(B, -1, 4, D // 4), (_x(dev),), {}),
        "view_numel",
        ["x.view(2, -1, 4, 8): x has 330 elements"],
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("make", "kind", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_check_catches_bug_before_torch(make, kind, expected, device):
    fn, args, kwargs = make(device)
    with pytest.raises(shapeguard.ShapeError) as info:
        shapeguard.trace(fn, *args, **kwargs)
    error = info.value
    assert error.kind == kind, str(error)
    # Raised by shapeguard's own rule, not converted from a torch failure.
    assert error.__cause__ is None
    message = str(error)
    for text in expected:
        assert text in message, f"{text!r} not in:\n{message}"
    assert "tensor(" not in message  # never tensor values


def test_message_format_line_by_line():
    model = HandAttention(bug="k_not_transposed")
    with pytest.raises(shapeguard.ShapeError) as info:
        shapeguard.trace(model, torch.randn(B, SQ, D))
    lines = str(info.value).splitlines()
    assert lines[0] == "scores = Q @ K: Q.d_k (11) != K.seq (5)"
    assert lines[1].startswith("  in  HandAttention at tests/attention_models.py:")
    assert lines[2] == "      scores = torch.matmul(Q, K) / math.sqrt(self.d_k)"
    assert lines[3] == "  Q      [batch=2, heads=3, seq=5, d_k=11] float32"
    assert lines[4] == "  K      [batch=2, heads=3, seq=5, d_k=11] float32"
    assert lines[5] == "  hint: K was not transposed: use Q @ K.transpose(-2, -1)"
    assert len(lines) == 6
    error = info.value
    assert (error.op, error.module) == ("matmul", "HandAttention")
    assert error.location.startswith("tests/attention_models.py:")
    assert [o.name for o in error.operands] == ["Q", "K"]


def test_shape_error_is_runtime_error_and_pickles():
    import pickle

    with pytest.raises(RuntimeError) as info:
        shapeguard.trace(HandAttention(bug="k_not_transposed"), torch.randn(B, SQ, D))
    copy = pickle.loads(pickle.dumps(info.value))
    assert isinstance(copy, shapeguard.ShapeError)
    assert (copy.kind, str(copy)) == (info.value.kind, str(info.value))


def test_torch_error_is_wrapped_with_context_and_chained():
    def concat(a, b):
        return torch.cat([a, b], dim=0)

    with pytest.raises(shapeguard.ShapeError) as info:
        shapeguard.trace(concat, torch.randn(B, H, SQ), torch.randn(B, H + 1, SQ))
    error = info.value
    assert error.kind == "torch_error"
    assert isinstance(error.__cause__, RuntimeError)
    assert not isinstance(error.__cause__, shapeguard.ShapeError)
    lines = str(error).splitlines()
    assert lines[0].startswith("cat failed in torch: Sizes of tensors must match")
    assert "  a      [2, 3, 5] float32" in lines
    assert "  b      [2, 4, 5] float32" in lines


def test_head_divisibility_at_construction_of_guarded_class():
    @shapeguard.guard
    class TutorialMHA(HandAttention):
        pass

    with pytest.raises(shapeguard.ShapeError) as info:
        TutorialMHA(d_model=512, n_heads=6)
    error = info.value
    assert error.kind == "head_divisibility"
    lines = str(error).splitlines()
    assert (
        lines[0]
        == "d_model=512 is not divisible by n_heads=6 (512 = 6 * 85 + 2) in TutorialMHA(...)"
    )
    assert "TutorialMHA(d_model=512, n_heads=6)" in lines[2]
    assert lines[-1] == (
        "  hint: head counts that work for d_model=512: 1, 2, 4, 8, 16, 32, 64, 128, 256; "
        "or pick d_model as a multiple of n_heads (e.g. 510)"
    )


def test_head_divisibility_when_guarding_an_instance():
    module = HandAttention(d_model=34, n_heads=H)  # d_k = 11 rounds down silently
    with pytest.raises(shapeguard.ShapeError, match="d_model=34 is not divisible by n_heads=3"):
        shapeguard.guard(module)
    assert not shapeguard.is_guarded(module)


def test_head_divisibility_at_the_head_split_view():
    class Split(nn.Module):
        def __init__(self):
            super().__init__()
            self.d_model, self.n_heads = 34, 3

        def forward(self, x):
            return x.view(x.shape[0], -1, self.n_heads, self.d_model // self.n_heads)

    with pytest.raises(shapeguard.ShapeError) as info:
        shapeguard.trace(Split(), torch.randn(B, SQ, 34))
    assert info.value.kind == "head_divisibility"
    assert "cannot split d_model=34 into n_heads=3 heads" in str(info.value)
    assert "head counts that work for d_model=34: 1, 2, 17, 34" in str(info.value)


def test_gqa_divisibility_at_construction():
    with pytest.raises(shapeguard.ShapeError) as info:
        shapeguard.guard(GQAttention(hidden_size=66, num_heads=6, num_key_value_heads=4))
    assert info.value.kind == "gqa_divisibility"
    assert "num_heads=6 is not divisible by num_key_value_heads=4" in str(info.value)
    assert "kv head counts that work for num_heads=6: 1, 2, 3, 6" in str(info.value)


def test_mha_divisibility_in_functional_call():
    q = torch.randn(SQ, B, 34)
    w = torch.randn(3 * 34, 34)

    def call(q):
        return F.multi_head_attention_forward(
            q,
            q,
            q,
            34,
            3,
            w,
            None,
            None,
            None,
            False,
            0.0,
            torch.randn(34, 34),
            None,
            need_weights=False,
        )

    with pytest.raises(shapeguard.ShapeError) as info:
        shapeguard.trace(call, q)
    assert info.value.kind == "head_divisibility"
    assert "embed_dim=34 is not divisible by num_heads=3" in str(info.value)


def test_softmax_over_query_axis_warns():
    with pytest.warns(shapeguard.ShapeWarning) as record:
        trace = shapeguard.trace(HandAttention(bug="softmax_axis"), torch.randn(B, SQ, D))
    message = str(record[0].message)
    assert message.splitlines()[0] == (
        "softmax over seq_q (dim -2) of scores: each query's weights must sum to 1 over the keys (seq_k)"
    )
    assert record[0].filename.endswith("attention_models.py")
    assert record[0].message.kind == "softmax_axis"
    assert [f.kind for f in trace.warnings] == ["softmax_axis"]


def test_softmax_warning_is_an_error_in_strict_mode():
    with pytest.raises(shapeguard.ShapeError) as info:
        shapeguard.trace(HandAttention(bug="softmax_axis"), torch.randn(B, SQ, D), strict=True)
    assert info.value.kind == "softmax_axis"


def test_bool_mask_added_to_scores_warns():
    """Scores by structure (a query-key product): the bool mask adds 0/1 to them."""

    def add_mask(q, k, mask):
        scores = q @ k.transpose(-2, -1)
        return scores + mask

    with pytest.warns(
        shapeguard.ShapeWarning, match="mask is a bool mask added to scores: it adds 0/1"
    ):
        shapeguard.trace(
            add_mask,
            torch.randn(B, H, SQ, 8),
            torch.randn(B, H, SK, 8),
            torch.ones(B, 1, 1, SK, dtype=torch.bool),
        )


def test_warn_mode_warns_then_raises_its_own_error_when_torch_fails_on_that_op():
    """Warn mode lets the op run; when torch then fails on it, the error raised is the
    rule's own (chained from torch's), not a generic torch_error."""
    module = shapeguard.guard(HandAttention(bug="k_not_transposed"), mode="warn")
    with (
        pytest.warns(shapeguard.ShapeWarning, match=r"scores = Q @ K: Q.d_k \(11\) != K.seq \(5\)"),
        pytest.raises(shapeguard.ShapeError) as info,
    ):
        module(torch.randn(B, SQ, D))
    assert info.value.kind == "matmul_inner"
    assert str(info.value).startswith("scores = Q @ K: Q.d_k (11) != K.seq (5)")
    assert isinstance(info.value.__cause__, RuntimeError)
    assert not isinstance(info.value.__cause__, shapeguard.ShapeError)
    kinds = [f.kind for f in shapeguard.last_trace(module).findings]
    assert kinds == ["matmul_inner"]


def test_an_einsum_verdict_is_kept_for_its_equation_and_shapes_only():
    # The size check's verdict is memoized by (equation, operand shapes): the same
    # equation on other shapes is judged again, in both directions.
    def scores(q, k):
        return torch.einsum("bhqd,bhkd->bhqk", q, k)

    good = (torch.randn(B, H, SQ, DK), torch.randn(B, H, SK, DK))
    bad = (torch.randn(B, H, SQ, DK), torch.randn(B, H, SK, DK + 2))
    for _ in range(2):
        assert shapeguard.trace(scores, *good).findings == []
        with pytest.raises(shapeguard.ShapeError) as info:
            shapeguard.trace(scores, *bad)
        assert info.value.kind == "einsum_dim"
        assert "'d' is 11 in q (axis 3) but 13 in k (axis 3)" in str(info.value)
