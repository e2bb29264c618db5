"""flash-attn on a GPU against shapeguard's SDPA fallback, on the same inputs.

Skipped without a CUDA GPU of compute capability 8.0+ and an importable flash-attn.
Run them in one go with `tests/gpu/run_gpu_checks.sh`.
"""

import math

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if torch.cuda.get_device_capability() < (8, 0):
    pytest.skip("flash-attn needs compute capability 8.0 or newer", allow_module_level=True)
try:
    import flash_attn
except Exception as error:  # a broken CUDA extension raises more than ImportError
    pytest.skip(f"needs flash-attn ({type(error).__name__}: {error})", allow_module_level=True)

import shapeguard
from shapeguard import attention
from shapeguard.attention import flash_attention, flash_attention_varlen

B, SQ, SK, HQ, HK, D = 2, 37, 53, 6, 2, 64  # pairwise distinct
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


def make(sq=SQ, sk=SK, hq=HQ, hk=HK, d=D, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(
        torch.randn(B, s, h, d, generator=g, device="cuda").to(dtype)
        for s, h in ((sq, hq), (sk, hk), (sk, hk))
    )


def rel_error(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


CASES = [  # (id, sizes, causal, window)
    ("full", {}, False, (-1, -1)),
    ("causal_square", {"sk": SQ}, True, (-1, -1)),
    ("causal_bottom_right_short_q", {}, True, (-1, -1)),
    ("causal_bottom_right_long_q", {"sq": SK, "sk": SQ}, True, (-1, -1)),
    ("mha", {"hk": HQ}, True, (-1, -1)),
    ("window", {}, False, (5, 3)),
    ("window_causal", {}, True, (9, -1)),
    ("head_dim_not_multiple_of_8", {"d": 44}, True, (-1, -1)),
]


@pytest.mark.parametrize(
    ("sizes", "causal", "window"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_flash_attn_func_equals_the_fallback(sizes, causal, window, dtype):
    q, k, v = make(dtype=dtype, **sizes)
    ours = flash_attention(q, k, v, causal=causal, window_size=window, backend="flash")
    theirs = flash_attn.flash_attn_func(q, k, v, causal=causal, window_size=window)
    fallback = flash_attention(q, k, v, causal=causal, window_size=window, backend="sdpa")
    assert torch.equal(ours, theirs)  # the entry point is flash_attn_func, untouched
    assert rel_error(fallback, theirs) < TOLERANCE[dtype]


def test_bhsd_layout_on_flash():
    q, k, v = make()
    bshd = flash_attention(q, k, v, causal=True, backend="flash")
    bhsd = flash_attention(*(t.transpose(1, 2) for t in (q, k, v)), causal=True, layout="bhsd")
    assert torch.equal(bhsd.transpose(1, 2), bshd)


def test_auto_picks_flash_on_this_gpu():
    q, _, _ = make()
    assert attention._path(q, "auto", announce=False) == "flash"


def test_varlen_flash_equals_the_fallback():
    g = torch.Generator(device="cuda").manual_seed(1)
    lengths_q, lengths_k = [11, 29], [17, 31]
    q = torch.randn(sum(lengths_q), HQ, D, generator=g, device="cuda").bfloat16()
    k = torch.randn(sum(lengths_k), HK, D, generator=g, device="cuda").bfloat16()
    v = torch.randn(sum(lengths_k), HK, D, generator=g, device="cuda").bfloat16()
    cu_q = torch.tensor([0, 11, 40], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 17, 48], dtype=torch.int32, device="cuda")
    args = (q, k, v, cu_q, cu_k, 29, 31)
    flash = flash_attention_varlen(*args, causal=True, backend="flash")
    fallback = flash_attention_varlen(*args, causal=True, backend="sdpa")
    assert rel_error(fallback, flash) < TOLERANCE[torch.bfloat16]


def test_float32_on_the_gpu_is_refused_with_the_rule():
    q, k, v = make(dtype=torch.float32)
    with pytest.raises(shapeguard.ShapeError) as info:
        flash_attention(q, k, v)
    assert info.value.kind == "flash_dtype"


def test_traced_flash_attn_func_is_checked_before_the_kernel():
    q, k, v = make(sk=SQ, hk=HQ)
    Q, K, V = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # [batch, heads, seq, d_k]
    K = K[:, :, :-1]  # break the square so the swap is provable from shapes alone
    V = V[:, :, :-1]
    with pytest.raises(shapeguard.ShapeError) as info, shapeguard.trace():
        flash_attn.flash_attn_func(Q, K, V)
    assert info.value.kind == "layout_bshd"
    with shapeguard.trace() as trace:
        context = flash_attn.flash_attn_func(q, k, v, causal=True)
    assert [e.op for e in trace.events] == ["flash_attn_func"]
    assert trace.shape_of("context") == tuple(context.shape)


def test_traced_kernel_op_is_checked():
    q, k, v = make(d=44)  # flash_attn_func pads to 48; the op itself needs it padded
    op = torch.ops.flash_attn._flash_attn_forward
    with pytest.raises(shapeguard.ShapeError) as info, shapeguard.trace():
        op(q, k, v, 0.0, 1 / math.sqrt(44), False, -1, -1, 0.0, None, False)
    assert info.value.kind == "flash_head_dim_multiple"
