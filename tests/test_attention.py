"""shapeguard.attention on CPU: the SDPA fallback computes flash-attn's attention, says so
once, and never imports flash_attn.

The reference below is written from flash-attn's docstring, independently of the
fallback: query i sees keys [i + seq_k - seq_q - left, i + seq_k - seq_q + right]
(right = 0 when causal; -1 is unbounded), query head h uses kv head h // (heads //
kv_heads), and a query that sees no key returns zeros.
"""

import math
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import shapeguard
from shapeguard import attention
from shapeguard.attention import FlashFallbackWarning, flash_attention, flash_attention_varlen

B, H, SQ, SK, D = 2, 3, 5, 7, 11  # pairwise distinct
HQ, HK = 6, 3  # grouped-query heads (with B, SQ, SK, D still distinct)


def reference(q, k, v, *, causal=False, window=(-1, -1), scale=None):
    """flash-attn's attention in float64, one query row at a time; q, k, v [b, s, h, d]."""
    q, k, v = (t.double() for t in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    left, right = window
    if causal:
        right = 0
    out = torch.zeros(b, sq, hq, v.shape[-1], dtype=torch.float64)
    for h in range(hq):
        kh, vh = k[:, :, h // (hq // hk)], v[:, :, h // (hq // hk)]
        for i in range(sq):
            keys = [
                j
                for j in range(sk)
                if (left < 0 or j >= i + sk - sq - left) and (right < 0 or j <= i + sk - sq + right)
            ]
            if not keys:
                continue  # flash-attn: a row that sees no key is zero
            scores = torch.einsum("bd,bjd->bj", q[:, i, h], kh[:, keys]) * scale
            out[:, i, h] = torch.einsum("bj,bjd->bd", scores.softmax(-1), vh[:, keys])
    return out


def rel_error(out, ref) -> float:
    return float((out.double() - ref).norm() / ref.norm())


def make(sq=SQ, sk=SK, hq=H, hk=H, d=D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, sq, hq, d, generator=g).to(dtype)
    k = torch.randn(B, sk, hk, d, generator=g).to(dtype)
    v = torch.randn(B, sk, hk, d, generator=g).to(dtype)
    return q, k, v


CASES = [  # (id, sizes, causal, window)
    ("full_cross", {}, False, (-1, -1)),
    ("causal_square", {"sk": SQ}, True, (-1, -1)),
    ("causal_bottom_right_short_q", {}, True, (-1, -1)),  # seq_q 5 < seq_k 7
    ("causal_bottom_right_long_q", {"sq": SK, "sk": SQ}, True, (-1, -1)),  # rows 0, 1 see nothing
    ("gqa", {"hq": HQ, "hk": HK}, False, (-1, -1)),
    ("gqa_causal", {"hq": HQ, "hk": HK}, True, (-1, -1)),
    ("window", {}, False, (2, 1)),
    ("window_causal", {}, True, (3, -1)),
    ("window_left_only", {"sq": SK, "sk": SQ}, False, (1, -1)),
]


@pytest.mark.parametrize(
    ("sizes", "causal", "window"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
@pytest.mark.parametrize(
    ("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)], ids=["fp32", "bf16"]
)
def test_fallback_matches_float64_reference(sizes, causal, window, dtype, tolerance):
    q, k, v = make(dtype=dtype, **sizes)
    out = flash_attention(q, k, v, causal=causal, window_size=window, backend="sdpa")
    assert out.shape == q.shape and out.dtype == dtype
    assert rel_error(out, reference(q, k, v, causal=causal, window=window)) < tolerance


def test_softmax_scale_is_used():
    q, k, v = make()
    out = flash_attention(q, k, v, softmax_scale=0.3, backend="sdpa")
    assert rel_error(out, reference(q, k, v, scale=0.3)) < 1e-5
    assert rel_error(out, reference(q, k, v)) > 1e-3  # the default scale gives another answer


@pytest.mark.parametrize(
    ("sq", "sk", "rows"),
    [
        (2, 5, [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]),
        (5, 2, [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]),
    ],
)
def test_causal_mask_is_flash_attn_docstring_example(sq, sk, rows):
    """flash_attn_func's docstring draws these two masks; equal scores and one-hot values
    make each output row the attention weights, so the mask can be read off."""
    q = torch.zeros(1, sq, 1, sk)
    v = torch.eye(sk)[None, :, None, :]  # key j carries the one-hot vector e_j
    out = flash_attention(q, torch.zeros(1, sk, 1, sk), v, causal=True, backend="sdpa")[0, :, 0]
    seen = (out > 0).int().tolist()
    assert seen == rows
    for row, allowed in zip(out, rows, strict=True):  # uniform over the keys a row sees
        if any(allowed):
            assert torch.allclose(row, torch.tensor(allowed) / sum(allowed))


@pytest.mark.no_shapeguard  # shows the warning on purpose
def test_top_left_sdpa_would_differ():
    """Proof the alignment matters for these sizes: SDPA's is_causal (top-left) disagrees."""
    q, k, v = make()
    ours = flash_attention(q, k, v, causal=True, backend="sdpa")
    top_left = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    assert rel_error(ours, reference(q, k, v, causal=True)) < 1e-5
    assert rel_error(top_left, reference(q, k, v, causal=True)) > 1e-2


def test_bhsd_layout_gives_the_same_attention_transposed():
    q, k, v = make(hq=HQ, hk=HK)
    bshd = flash_attention(q, k, v, causal=True, backend="sdpa")
    bhsd = flash_attention(
        *(t.transpose(1, 2) for t in (q, k, v)), causal=True, layout="bhsd", backend="sdpa"
    )
    assert bhsd.shape == (B, HQ, SQ, D)
    assert torch.allclose(bhsd.transpose(1, 2), bshd, atol=1e-6)


def test_fallback_runs_on_meta_without_warning():
    q, k, v = (t.to("meta") for t in make(hq=HQ, hk=HK))
    out = flash_attention(q, k, v, causal=True, window_size=(2, 0))  # backend="auto"
    assert out.shape == (B, SQ, HQ, D) and out.device.type == "meta"


def test_varlen_fallback_is_dense_attention_per_sequence():
    lengths_q, lengths_k = [2, 5], [3, 6]  # two sequences, each with seq_q != seq_k
    g = torch.Generator().manual_seed(1)
    q = torch.randn(sum(lengths_q), H, D, generator=g)
    k = torch.randn(sum(lengths_k), H, D, generator=g)
    v = torch.randn(sum(lengths_k), H, D, generator=g)
    cu_q = torch.tensor([0, 2, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 3, 9], dtype=torch.int32)
    out = flash_attention_varlen(q, k, v, cu_q, cu_k, 5, 6, causal=True, backend="sdpa")
    assert out.shape == q.shape
    for b in range(2):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        ref = reference(q[None, qs], k[None, ks], v[None, ks], causal=True)[0]
        assert rel_error(out[qs], ref) < 1e-5


# -- the fallback is announced once, and can be silenced ---------------------------------
@pytest.fixture
def fresh_announcements(monkeypatch):
    monkeypatch.setattr(attention, "_announced", set())


def test_fallback_warns_once_with_reason(fresh_announcements):
    q, k, v = make()
    with pytest.warns(FlashFallbackWarning) as record:
        flash_attention(q, k, v)
        flash_attention(q, k, v)
    assert len(record) == 1
    assert str(record[0].message) == (
        "shapeguard.attention: q is on cpu, and flash-attn runs on CUDA only; running torch's "
        "scaled_dot_product_attention with flash-attn's semantics instead"
    )
    assert record[0].filename == __file__  # pointed at the caller's line, not at shapeguard


def test_fallback_warning_can_be_silenced_by_category(fresh_announcements):
    q, k, v = make()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=FlashFallbackWarning)
        out = flash_attention(q, k, v)
    assert out.shape == q.shape


def test_fallback_warning_is_not_a_shape_warning():
    # Code that turns ShapeWarning into errors must not fail on a laptop for lack of a GPU.
    assert not issubclass(FlashFallbackWarning, shapeguard.ShapeWarning)
    assert issubclass(FlashFallbackWarning, UserWarning)


def test_explicit_sdpa_backend_does_not_warn(fresh_announcements):
    q, k, v = make()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flash_attention(q, k, v, backend="sdpa")


@pytest.mark.no_shapeguard
def test_backend_flash_off_gpu_is_refused_with_the_rule():
    q, k, v = make(dtype=torch.float16)
    with pytest.raises(shapeguard.ShapeError) as info:
        flash_attention(q, k, v, backend="flash")
    assert info.value.kind == "flash_device"
    lines = str(info.value).splitlines()
    assert lines[0] == "flash_attention: q is on cpu; FlashAttention runs on CUDA only"
    assert lines[1].startswith("  at tests/test_attention.py:")
    assert lines[2] == '      flash_attention(q, k, v, backend="flash")'


def test_backend_flash_without_flash_attn_is_a_contract_error(monkeypatch):
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    monkeypatch.setattr(attention, "_import_failure", "flash-attn is not installed")
    q, k, v = (t.to("meta") for t in make(dtype=torch.bfloat16))
    with pytest.raises(shapeguard.ContractError, match="backend='flash' needs flash-attn, and "):
        flash_attention(q, k, v, backend="flash")


def test_float32_is_fine_on_the_fallback():
    q, k, v = make(dtype=torch.float32)
    assert flash_attention(q, k, v, backend="sdpa").dtype == torch.float32


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window_size": (3,)}, "window_size=(3,) is not a (left, right) pair of ints >= -1"),
        ({"window_size": (-2, 0)}, "window_size=(-2, 0) is not a (left, right) pair"),
        ({"layout": "bsd"}, "layout='bsd' is not supported; use one of ('bshd', 'bhsd')"),
        ({"backend": "xformers"}, "backend='xformers' is not supported"),
    ],
)
def test_bad_arguments_are_contract_errors(kwargs, message):
    q, k, v = make()
    with pytest.raises(
        shapeguard.ContractError, match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        flash_attention(q, k, v, **kwargs)


def test_non_tensor_input_is_a_contract_error():
    q, k, _ = make()
    with pytest.raises(
        shapeguard.ContractError, match="flash_attention: v is a list, not a tensor"
    ):
        flash_attention(q, k, [1, 2], backend="sdpa")


@pytest.mark.no_shapeguard
def test_checks_off_means_off():
    q, k, v = make()
    v = v[..., :4]  # a head size flash-attn refuses; SDPA alone computes it
    with pytest.raises(shapeguard.ShapeError, match="flash_head_dim|d_k"):
        flash_attention(q, k, v, backend="sdpa")
    shapeguard.disable()
    try:
        assert flash_attention(q, k, v, backend="sdpa").shape == (B, SQ, H, 4)
    finally:
        shapeguard.enable()


def test_inside_a_trace_the_call_is_one_named_event():
    q, k, v = make(hq=HQ, hk=HK)
    with shapeguard.trace() as t:
        context = flash_attention(q, k, v, causal=True, backend="sdpa")
    assert [e.op for e in t.events] == ["flash_attention"]
    assert t.events[0].outputs[0].label == "context"
    assert t.shape_of("context") == tuple(context.shape)


# -- import hygiene ------------------------------------------------------------------------
PROBE = textwrap.dedent(
    """
    import sys
    import shapeguard, shapeguard.attention, shapeguard._trace.flash, shapeguard.checks.flash
    import torch
    from shapeguard.attention import flash_attention
    x = torch.randn(1, 2, 3, 8)
    with shapeguard.trace():
        flash_attention(x, x, x, backend="sdpa")
    print("flash_attn" in sys.modules)
    import flash_attn  # the stand-in: proves the probe above could have seen an import
    print("flash_attn" in sys.modules)
    """
)


def test_shapeguard_attention_never_imports_flash_attn(tmp_path):
    # A stand-in flash_attn package on the path, so an import would succeed and be seen.
    package = tmp_path / "flash_attn"
    package.mkdir()
    (package / "__init__.py").write_text('"""STAND-IN for flash-attn, tests only."""\n')
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(tmp_path)},
        check=True,
    )
    assert result.stdout.split() == ["False", "True"]
