"""flash-attn's contract, rule by rule, on meta and CPU tensors, without flash-attn.

flash-attn cannot be installed here (it needs CUDA). Calls inside a trace are checked
through a STAND-IN module injected as `flash_attn` in sys.modules (and removed after
each test): it has flash-attn's entry points with their signatures, each returning a
tensor shaped like flash-attn's output. torch.ops kernels are checked through a
STAND-IN op registered as flash_attn::_flash_attn_forward for the test and removed
after (the real one is used when flash-attn is loaded).
"""

import sys
import threading
import types

import pytest
import torch
from torch import nn

import shapeguard
from shapeguard._trace import flash as _flash
from shapeguard._trace.call import op_name
from shapeguard.attention import flash_attention
from shapeguard.checks import flash as flash_checks

pytestmark = pytest.mark.no_shapeguard  # these tests trigger violations on purpose

B, SQ, SK, H, D = 2, 5, 7, 3, 16  # pairwise distinct; D a multiple of 8
HQ, HK = 6, 4  # heads that do not group (6 % 4)
F16 = torch.float16


def t(*shape, dtype=F16, device="meta"):
    return torch.empty(*shape, dtype=dtype, device=device)


def qkv(sq=SQ, sk=SK, hq=H, hk=H, d=D, **kw):
    return t(B, sq, hq, d, **kw), t(B, sk, hk, d, **kw), t(B, sk, hk, d, **kw)


# -- the stand-in flash_attn module ---------------------------------------------------------
def make_standin() -> types.ModuleType:
    """A STAND-IN for flash-attn's Python API: same names and signatures, no kernels."""
    module = types.ModuleType("flash_attn")
    module.__doc__ = "STAND-IN for flash-attn, injected by tests/test_flash_contract.py"
    module.calls = []

    def flash_attn_func(
        q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
        softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
    ):  # fmt: skip
        module.calls.append("flash_attn_func")
        return torch.empty_like(q)

    def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False):
        module.calls.append("flash_attn_qkvpacked_func")
        return torch.empty_like(qkv[:, :, 0])

    def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False):
        module.calls.append("flash_attn_kvpacked_func")
        return torch.empty_like(q)

    def flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
        softmax_scale=None, causal=False, window_size=(-1, -1), block_table=None,
    ):  # fmt: skip
        module.calls.append("flash_attn_varlen_func")
        return torch.empty_like(q)

    def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0):
        module.calls.append("flash_attn_varlen_qkvpacked_func")
        return torch.empty_like(qkv[:, 0])

    def flash_attn_varlen_kvpacked_func(
        q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0
    ):
        module.calls.append("flash_attn_varlen_kvpacked_func")
        return torch.empty_like(q)

    for func in (
        flash_attn_func, flash_attn_qkvpacked_func, flash_attn_kvpacked_func,
        flash_attn_varlen_func, flash_attn_varlen_qkvpacked_func, flash_attn_varlen_kvpacked_func,
    ):  # fmt: skip
        func.__module__ = "flash_attn.flash_attn_interface"
        setattr(module, func.__name__, func)
    return module


@pytest.fixture
def fa(monkeypatch):
    """The stand-in, as `flash_attn`, plus a user module that did `from flash_attn import ...`."""
    module = make_standin()
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    user = types.ModuleType("standin_user_model")
    user.__doc__ = "STAND-IN user code: `from flash_attn import flash_attn_func` at import"
    user.flash_attn_func = module.flash_attn_func
    user.flash_attn_varlen_func = module.flash_attn_varlen_func
    monkeypatch.setitem(sys.modules, user.__name__, user)
    return module, user


def call(fa, name, *args, **kwargs):
    """Call stand-in flash-attn's `name` inside a trace; raise what the trace raises."""
    module, _ = fa
    with shapeguard.trace():
        return getattr(module, name)(*args, **kwargs)


def cu(*values, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype)


# (id, function, make args, kind, first line, hint fragment)
DENSE = [
    (
        "rank",
        "flash_attn_func",
        lambda: (t(B, SQ, H * D), *qkv()[1:]),
        "flash_rank",
        "flash_attn_func: q has 3 axes; flash_attn_func takes 4: [batch, seq, heads, d_k]",
        "split the heads first: q.view(batch, seq, heads, d_k)",
    ),
    (
        "batch",
        "flash_attn_func",
        lambda: (qkv()[0], t(3, SK, H, D), t(3, SK, H, D)),
        "flash_batch",
        "flash_attn_func: q.batch (2) != k.batch (3)",
        "q, k and v must come from the same batch",
    ),
    (
        "batch_zero",
        "flash_attn_func",
        lambda: (t(0, SQ, H, D), t(0, SK, H, D), t(0, SK, H, D)),
        "flash_batch",
        "flash_attn_func: q.batch is 0",
        "at least one sequence",
    ),
    (
        "head_dim",
        "flash_attn_func",
        lambda: (*qkv()[:2], t(B, SK, H, 8)),
        "flash_head_dim",
        "flash_attn_func: q.d_k (16) != v.d_k (8)",
        "flash-attention#632",
    ),
    (
        "head_dim_max",
        "flash_attn_func",
        lambda: qkv(d=264),
        "flash_head_dim_max",
        "flash_attn_func: q.d_k (264) > 256, the largest head size FlashAttention supports",
        "more heads of a smaller size",
    ),
    (
        "kv_seq",
        "flash_attn_func",
        lambda: (*qkv()[:2], t(B, 9, H, D)),
        "flash_kv_seq",
        "flash_attn_func: k.seq_k (7) != v.seq_k (9)",
        "every key needs a value",
    ),
    (
        "kv_heads",
        "flash_attn_func",
        lambda: (*qkv()[:2], t(B, SK, 1, D)),
        "flash_kv_heads",
        "flash_attn_func: k.kv_heads (3) != v.kv_heads (1)",
        "same number of heads",
    ),
    (
        "gqa",
        "flash_attn_func",
        lambda: qkv(hq=HQ, hk=HK),
        "flash_gqa",
        "flash_attn_func: q.heads (6) is not a multiple of k.kv_heads (4)",
        "kv head counts that work: 1, 2, 3, 6",
    ),
    (
        "dtype_mismatch",
        "flash_attn_func",
        lambda: (qkv()[0], *qkv(dtype=torch.bfloat16)[1:]),
        "flash_dtype_mismatch",
        "flash_attn_func: q is float16 but k is bfloat16",
        "k.to(q.dtype)",
    ),
    (
        "device_mismatch",
        "flash_attn_func",
        lambda: (qkv(device="cpu")[0], *qkv()[1:]),
        "flash_device_mismatch",
        "flash_attn_func: q is on cpu but k is on meta",
        "k.to(q.device)",
    ),
    (
        "dtype_fp32",
        "flash_attn_func",
        lambda: qkv(dtype=torch.float32),
        "flash_dtype",
        "flash_attn_func: q is float32; FlashAttention takes float16 or bfloat16 only",
        "a LayerNorm kept in float32 is the usual one",
    ),
    (
        "device_cpu",
        "flash_attn_func",
        lambda: qkv(device="cpu"),
        "flash_device",
        "flash_attn_func: q is on cpu; FlashAttention runs on CUDA only",
        "shapeguard.attention.flash_attention, which runs torch's SDPA off the GPU",
    ),
    (
        "layout_swap",
        "flash_attn_func",
        lambda: (t(B, H, SQ, D), t(B, H, SK, D), t(B, H, SK, D)),
        "layout_bshd",
        "flash_attn_func: q, k, v look like [batch, heads, seq, d_k]; flash_attn_func takes "
        "[batch, seq, heads, d_k]",
        "as given, q.heads (5) is not a multiple of k.kv_heads (7); with axes 1 and 2 swapped "
        "every rule holds. Pass q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2) and "
        "transpose the output back",
    ),
    (
        "qkvpacked",
        "flash_attn_qkvpacked_func",
        lambda: (t(B, SQ, 2, H, D),),
        "flash_packed",
        "flash_attn_qkvpacked_func: qkv [2, 5, 2, 3, 16] is not [batch, seq, 3, heads, d_k]",
        "torch.stack([q, k, v], dim=2)",
    ),
    (
        "qkvpacked_inner",
        "flash_attn_qkvpacked_func",
        lambda: (t(B, SQ, 3, H, 264),),
        "flash_head_dim_max",
        "flash_attn_qkvpacked_func: qkv[:, :, 0].d_k (264) > 256, the largest head size "
        "FlashAttention supports",
        "",
    ),
    (
        "kvpacked",
        "flash_attn_kvpacked_func",
        lambda: (qkv()[0], t(B, SK, H, D)),
        "flash_packed",
        "flash_attn_kvpacked_func: kv [2, 7, 3, 16] is not [batch, seq_k, 2, kv_heads, d_k]",
        "torch.stack([k, v], dim=2)",
    ),
    (
        "kvpacked_gqa",
        "flash_attn_kvpacked_func",
        lambda: (t(B, SQ, HQ, D), t(B, SK, 2, HK, D)),
        "flash_gqa",
        "flash_attn_kvpacked_func: q.heads (6) is not a multiple of kv[:, :, 0].kv_heads (4)",
        "",
    ),
]

TOTAL_Q, TOTAL_K = 9, 11  # two sequences: q 4 + 5, k 5 + 6


def varlen(q=None, k=None, v=None, cu_q=None, cu_k=None, max_q=5, max_k=6):
    return (
        t(TOTAL_Q, H, D) if q is None else q,
        t(TOTAL_K, H, D) if k is None else k,
        t(TOTAL_K, H, D) if v is None else v,
        cu(0, 4, 9) if cu_q is None else cu_q,
        cu(0, 5, 11) if cu_k is None else cu_k,
        max_q,
        max_k,
    )


VARLEN = [
    (
        "varlen_rank",
        "flash_attn_varlen_func",
        lambda: varlen(q=t(B, SQ, H, D)),
        "flash_rank",
        "flash_attn_varlen_func: q has 4 axes; flash_attn_varlen_func takes 3: [total, heads, d_k]",
        "flash_attn.bert_padding.unpad_input",
    ),
    (
        "cu_dtype",
        "flash_attn_varlen_func",
        lambda: varlen(cu_q=cu(0, 4, 9, dtype=torch.int64)),
        "flash_cu_seqlens_dtype",
        "flash_attn_varlen_func: cu_seqlens_q is int64; cu_seqlens must be int32",
        "torch.cumsum returns int64",
    ),
    (
        "cu_rank",
        "flash_attn_varlen_func",
        lambda: varlen(cu_k=cu(0, 5, 11)[None]),
        "flash_cu_seqlens_shape",
        "flash_attn_varlen_func: cu_seqlens_k [1, 3] is not [batch + 1] with batch >= 1",
        "F.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))",
    ),
    (
        "cu_batch",
        "flash_attn_varlen_func",
        lambda: varlen(cu_k=cu(0, 2, 5, 11)),
        "flash_cu_seqlens_shape",
        "flash_attn_varlen_func: cu_seqlens_q has 3 entries but cu_seqlens_k has 4; both are "
        "[batch + 1]",
        "the same batch of sequences",
    ),
    (
        "cu_start",
        "flash_attn_varlen_func",
        lambda: varlen(cu_q=cu(4, 4, 9)),
        "flash_cu_seqlens_order",
        "flash_attn_varlen_func: cu_seqlens_q[0] is 4, not 0",
        "starting at 0",
    ),
    (
        "cu_decreasing",
        "flash_attn_varlen_func",
        lambda: varlen(cu_k=cu(0, 6, 5)),
        "flash_cu_seqlens_order",
        "flash_attn_varlen_func: cu_seqlens_k decreases at index 2: cu_seqlens_k[2] (5) < "
        "cu_seqlens_k[1] (6)",
        "never decreases",
    ),
    (
        "cu_total",
        "flash_attn_varlen_func",
        lambda: varlen(cu_q=cu(0, 4, 8)),
        "flash_cu_seqlens_total",
        "flash_attn_varlen_func: cu_seqlens_q[-1] (8) != q.total_q (9)",
        "q holds 9",
    ),
    (
        "max_seqlen",
        "flash_attn_varlen_func",
        lambda: varlen(max_k=4),
        "flash_max_seqlen",
        "flash_attn_varlen_func: max_seqlen_k (4) < the longest sequence in cu_seqlens_k "
        "(6, sequence 1)",
        "pass max_seqlen_k=6",
    ),
    (
        "varlen_gqa",
        "flash_attn_varlen_func",
        lambda: varlen(q=t(TOTAL_Q, HQ, D), k=t(TOTAL_K, HK, D), v=t(TOTAL_K, HK, D)),
        "flash_gqa",
        "flash_attn_varlen_func: q.heads (6) is not a multiple of k.kv_heads (4)",
        "kv head counts that work: 1, 2, 3, 6",
    ),
    (
        "varlen_kv_tokens",
        "flash_attn_varlen_func",
        lambda: varlen(v=t(TOTAL_Q, H, D)),
        "flash_kv_seq",
        "flash_attn_varlen_func: k.total_k (11) != v.total_k (9)",
        "must hold the same tokens",
    ),
    (
        "varlen_qkvpacked",
        "flash_attn_varlen_qkvpacked_func",
        lambda: (t(TOTAL_Q, 4, 3, D), cu(0, 4, 9), 5),
        "flash_packed",
        "flash_attn_varlen_qkvpacked_func: qkv [9, 4, 3, 16] is not [total, 3, heads, d_k]",
        "torch.stack([q, k, v], dim=1)",
    ),
    (
        "varlen_qkvpacked_total",
        "flash_attn_varlen_qkvpacked_func",
        lambda: (t(TOTAL_Q, 3, H, D), cu(0, 4, 10), 6),
        "flash_cu_seqlens_total",
        "flash_attn_varlen_qkvpacked_func: cu_seqlens[-1] (10) != qkv[:, 0].total_q (9)",
        "",
    ),
    (
        "varlen_kvpacked",
        "flash_attn_varlen_kvpacked_func",
        lambda: (t(TOTAL_Q, H, D), t(TOTAL_K, H, D), cu(0, 4, 9), cu(0, 5, 11), 5, 6),
        "flash_packed",
        "flash_attn_varlen_kvpacked_func: kv [11, 3, 16] is not [total_k, 2, kv_heads, d_k]",
        "torch.stack([k, v], dim=1)",
    ),
]


@pytest.mark.parametrize(
    ("name", "make", "kind", "first", "hint"),
    [c[1:] for c in DENSE + VARLEN],
    ids=[c[0] for c in DENSE + VARLEN],
)
def test_each_rule_is_checked_before_the_call(fa, name, make, kind, first, hint):
    module, _ = fa
    with pytest.raises(shapeguard.ShapeError) as info:
        call(fa, name, *make())
    error = info.value
    assert error.kind == kind
    lines = str(error).splitlines()
    assert lines[0] == first
    assert lines[1].startswith("  at tests/test_flash_contract.py:")
    assert lines[2] == "      return getattr(module, name)(*args, **kwargs)"
    assert lines[-1].startswith("  hint: ") and hint in lines[-1]
    assert module.calls == []  # refused before flash-attn ran


def test_a_good_call_runs_and_is_one_event_named_by_the_user(fa):
    module, user = fa
    q, k, v = qkv(hq=HQ, hk=H)
    with shapeguard.trace() as trace:
        context = user.flash_attn_func(q, k, v, causal=True)
    assert module.calls == ["flash_attn_func"]
    assert [e.op for e in trace.events] == ["flash_attn_func"]
    assert trace.events[0].outputs[0].label == "context"
    assert trace.shape_of("context") == tuple(context.shape) == (B, SQ, HQ, D)


def test_good_varlen_call_runs(fa):
    module, user = fa
    with shapeguard.trace() as trace:
        user.flash_attn_varlen_func(*varlen())
    assert module.calls == ["flash_attn_varlen_func"]
    assert trace.errors == []


def test_layout_swap_names_the_users_tensors(fa):
    _, user = fa
    Q, K, V = t(B, H, SQ, D), t(B, H, SK, D), t(B, H, SK, D)
    with pytest.raises(shapeguard.ShapeError) as info, shapeguard.trace():
        out = user.flash_attn_func(Q, K, V, causal=True)  # noqa: F841
    assert str(info.value).splitlines() == [
        "flash_attn_func: Q, K, V look like [batch, heads, seq, d_k]; flash_attn_func takes "
        "[batch, seq, heads, d_k]",
        f"  at tests/test_flash_contract.py:{_line_of('out = user.flash_attn_func(Q, K, V')}",
        "      out = user.flash_attn_func(Q, K, V, causal=True)  # noqa: F841",
        "  Q      [batch=2, seq_q=3, heads=5, d_k=16] float16",
        "  K      [batch=2, seq_k=3, kv_heads=7, d_k=16] float16",
        "  V      [batch=2, seq_k=3, kv_heads=7, d_k=16] float16",
        "  hint: as given, Q.heads (5) is not a multiple of K.kv_heads (7); with axes 1 and 2 "
        "swapped every rule holds. Pass Q.transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2) "
        "and transpose the output back, or call "
        "shapeguard.attention.flash_attention(..., layout='bhsd')",
    ]


def _line_of(text: str) -> int:
    with open(__file__) as f:
        for n, line in enumerate(f, 1):
            if text in line and "_line_of" not in line:
                return n
    raise AssertionError(text)


class SelfAttention(nn.Module):
    """The tutorial's mistake: [batch, heads, seq, d_k] handed to flash_attn_func."""

    def __init__(self, flash_attn, d_model=H * D, n_heads=H):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.flash_attn = flash_attn
        self.qkv = nn.Linear(d_model, 3 * d_model, device="meta", dtype=F16)

    def forward(self, x):
        batch, seq, _ = x.shape
        Q, K, V = self.qkv(x).view(batch, seq, 3, self.n_heads, self.d_k).unbind(2)
        Q, K, V = (z.transpose(1, 2) for z in (Q, K, V))  # the tutorial's layout
        return self.flash_attn.flash_attn_func(Q, K, V, causal=True)


def test_self_attention_layout_swap_is_seen_from_the_declared_heads(fa):
    # Square self-attention fits both readings; the module's n_heads tells them apart.
    module, _ = fa
    model = SelfAttention(module)
    with pytest.raises(shapeguard.ShapeError) as info:
        shapeguard.trace(model, t(B, SQ, H * D))
    assert info.value.kind == "layout_bshd"
    assert "the module declares n_heads=3, and axis 1 of" in info.value.hint
    assert module.calls == []


def test_too_many_heads_is_a_warning(fa):
    module, _ = fa
    q = t(1, 8, 300, D)  # 300 "heads" of 8 positions: [batch, heads, seq, d_k] read as bshd
    with pytest.warns(shapeguard.ShapeWarning) as record:
        call(fa, "flash_attn_func", q, q, q)
    message = str(record[0].message)
    assert message.splitlines()[0] == (
        "flash_attn_func: q, k, v look like [batch, heads, seq, d_k]; flash_attn_func takes "
        "[batch, seq, heads, d_k]"
    )
    assert "q would have 300 heads of 8 positions; more than 256 heads is unusual" in message
    assert module.calls == ["flash_attn_func"]  # legal, so it still runs


def test_last_axis_stride_is_a_warning(fa):
    module, _ = fa
    q = t(B, SQ, H, 2 * D)[..., ::2]
    with pytest.warns(shapeguard.ShapeWarning) as record:
        call(fa, "flash_attn_func", q, *qkv()[1:])
    message = str(record[0].message)
    assert message.splitlines()[0] == "flash_attn_func: q's last axis has stride 2, not 1"
    assert "flash-attn copies q to make its last axis contiguous" in message
    assert module.calls == ["flash_attn_func"]


def test_warn_mode_reports_and_lets_flash_attn_decide(fa):
    module, user = fa
    warns = pytest.warns(shapeguard.ShapeWarning, match="is not a multiple of")
    with warns, shapeguard.trace(mode="warn") as trace:
        user.flash_attn_func(*qkv(hq=HQ, hk=HK))
    assert [f.kind for f in trace.findings] == ["flash_gqa"]
    assert module.calls == ["flash_attn_func"]


def test_outside_a_trace_flash_attn_is_untouched(fa):
    module, user = fa
    original = module.flash_attn_func
    user.flash_attn_func(*qkv(hq=HQ, hk=HK))  # no trace: not shapeguard's call to check
    assert module.calls == ["flash_attn_func"]
    assert user.flash_attn_func is original


# -- the entry point's own layout argument --------------------------------------------------
def test_entry_point_bhsd_given_bshd_is_named():
    q, k, v = qkv()  # [batch, seq, heads, d_k]
    with pytest.raises(shapeguard.ShapeError) as info:
        flash_attention(q, k, v, layout="bhsd")
    assert info.value.kind == "layout_bhsd"
    assert str(info.value).splitlines()[0] == (
        "flash_attention: q, k, v look like [batch, seq, heads, d_k]; flash_attention takes "
        "[batch, heads, seq, d_k]"
    )
    assert "Pass layout='bshd' (the output comes back the same way), or" in info.value.hint


def test_entry_point_checks_shapes_on_the_fallback_too():
    q, k, v = qkv(hq=HQ, hk=HK, dtype=torch.float32, device="cpu")
    with pytest.raises(shapeguard.ShapeError) as info:
        flash_attention(q, k, v, backend="sdpa")
    assert str(info.value).splitlines()[0] == (
        "flash_attention: q.heads (6) is not a multiple of k.kv_heads (4)"
    )


# -- wrapping and restoring ------------------------------------------------------------------
def test_imported_names_are_wrapped_only_while_a_trace_is_active(fa):
    module, user = fa
    original, varlen_original = module.flash_attn_func, module.flash_attn_varlen_func
    with shapeguard.trace():
        # Six names in flash_attn and two in the user's module: nothing else is touched.
        assert len(_flash.bindings) == 8
        assert module.flash_attn_func is not original
        assert user.flash_attn_func is module.flash_attn_func
        assert user.flash_attn_func.__wrapped__ is original
        assert user.flash_attn_varlen_func.__wrapped__ is varlen_original
    assert module.flash_attn_func is original and user.flash_attn_func is original
    assert user.flash_attn_varlen_func is varlen_original


def test_restored_when_the_traced_code_raises(fa):
    module, user = fa
    original = module.flash_attn_func
    with pytest.raises(shapeguard.ShapeError), shapeguard.trace():
        user.flash_attn_func(*qkv(hq=HQ, hk=HK))
    assert module.flash_attn_func is original and user.flash_attn_func is original
    with pytest.raises(KeyError), shapeguard.trace():
        raise KeyError("not a shape problem")
    assert user.flash_attn_func is original


def test_nested_traces_restore_when_the_outer_one_closes(fa):
    module, user = fa
    original = module.flash_attn_func
    with shapeguard.trace():
        with shapeguard.trace():
            pass
        assert user.flash_attn_func is not original  # the outer trace still holds it
        with pytest.raises(shapeguard.ShapeError):
            user.flash_attn_func(*qkv(hq=HQ, hk=HK))
    assert user.flash_attn_func is original


def test_a_name_rebound_during_the_trace_is_left_alone(fa):
    module, user = fa

    def mine(*args, **kwargs):
        return "mine"

    with shapeguard.trace():
        user.flash_attn_func = mine
    assert user.flash_attn_func is mine
    assert module.flash_attn_func.__name__ == "flash_attn_func"
    assert not hasattr(module.flash_attn_func, "__shapeguard_original__")


def test_another_thread_is_not_checked(fa):
    module, user = fa
    results = []

    def worker():
        results.append(user.flash_attn_func(*qkv(hq=HQ, hk=HK)).shape)

    with shapeguard.trace():
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    assert results == [torch.Size([B, SQ, HQ, D])]  # no trace in that thread: not checked


def test_nothing_is_imported_or_wrapped_without_flash_attn(monkeypatch):
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    with shapeguard.trace():
        assert _flash.bindings == []
    assert "flash_attn" not in sys.modules


# -- torch.ops.flash_attn kernels --------------------------------------------------------------
_SCHEMA = (
    "_flash_attn_forward(Tensor q, Tensor k, Tensor v, float dropout_p, float softmax_scale, "
    "bool causal, int window_size_left, int window_size_right, float softcap, "
    "Tensor? alibi_slopes, bool return_softmax) -> (Tensor, Tensor, Tensor, Tensor)"
)


def _standin_kernel(q, k, v, *rest):
    """STAND-IN kernel: flash-attn's output shapes, no attention."""
    b, s, h, _ = q.shape
    return torch.empty_like(q), q.new_empty(b, h, s), q.new_empty(0), q.new_empty(2)


def _define(namespace: str):
    lib = torch.library.Library(namespace, "FRAGMENT")
    lib.define(_SCHEMA)
    lib.impl("_flash_attn_forward", _standin_kernel, "CompositeExplicitAutograd")
    return lib


@pytest.fixture
def kernel_op():
    """torch.ops.flash_attn._flash_attn_forward: flash-attn's own when it is loaded (its fake
    kernel runs on meta), else a STAND-IN registered for this test and removed after."""
    if hasattr(torch.ops.flash_attn, "_flash_attn_forward"):
        yield torch.ops.flash_attn._flash_attn_forward
        return
    lib = _define("flash_attn")
    try:
        yield torch.ops.flash_attn._flash_attn_forward
    finally:
        lib._destroy()


def test_the_session_names_kernel_ops_as_the_checks_expect(kernel_op):
    assert op_name(kernel_op) == "_flash_attn_forward"
    assert op_name(kernel_op.default) == "_flash_attn_forward.default"
    from shapeguard.checks import rules_for

    for spelling in ("_flash_attn_forward", "_flash_attn_forward.default"):
        assert flash_checks.flash_contract in [r.check for r in rules_for(spelling)]


def test_kernel_op_is_checked_with_the_unpadded_head_size_rule(kernel_op):
    q, k, v = qkv(d=11)
    with pytest.raises(shapeguard.ShapeError) as info, shapeguard.trace():
        kernel_op(q, k, v, 0.0, 0.25, False, -1, -1, 0.0, None, False)
    assert info.value.kind == "flash_head_dim_multiple"
    assert str(info.value).splitlines()[0] == (
        "torch.ops.flash_attn._flash_attn_forward: q.d_k (11) is not a multiple of 8"
    )
    assert "F.pad(t, (0, 5))" in info.value.hint


def test_kernel_op_layout_swap_through_the_overload(kernel_op):
    q, k, v = t(B, H, SQ, D), t(B, H, SK, D), t(B, H, SK, D)
    with pytest.raises(shapeguard.ShapeError) as info, shapeguard.trace():
        kernel_op.default(q, k, v, 0.0, 0.25, causal=True, window_size_left=-1,
                          window_size_right=-1, softcap=0.0, alibi_slopes=None,
                          return_softmax=False)  # fmt: skip
    assert info.value.kind == "layout_bshd"


def test_an_op_of_the_same_name_elsewhere_is_not_checked():
    lib = _define("shapeguard_test_ns")
    try:
        q, k, v = t(B, H, SQ, D), t(B, H, SK, D), t(B, H, SK, D)
        with shapeguard.trace() as trace:
            torch.ops.shapeguard_test_ns._flash_attn_forward(
                q, k, v, 0.0, 0.25, False, -1, -1, 0.0, None, False
            )
        assert trace.findings == []
    finally:
        lib._destroy()


def test_explain_gets_the_right_import():
    hint = _flash.import_hint("flash_attention")
    assert hint.startswith("flash_attn has no `flash_attention`: use `from flash_attn import ")
    assert "flash_attn_func` (q, k, v as [batch, seq, heads, head_dim]" in hint
    assert _flash.import_hint("flash_attn_func") is None
