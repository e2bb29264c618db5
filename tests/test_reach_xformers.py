"""xformers' `memory_efficient_attention` in a trace (issue 28): q, k, v and the attn_bias
checked before the call runs, in its BMHK names, and the call's reach read from the bias
(block-diagonal by its seqstarts, other classes by `materialize`, a tensor by its values),
also on a CPU, where the kernel cannot run and its own failure propagates unchanged.

The keys each query must see are built by hand (loops over positions and blocks), at
pairwise distinct, coincident and realistic sizes. Skipped where xformers is not
importable (it is not in the test dependencies: `pip install --no-deps xformers`).
"""

import contextlib
import sys
import types

import pytest
import torch
from torch import nn
from trace_helpers import REACH_SETTING as SETTING
from trace_helpers import REACH_SETTINGS as SETTINGS
from trace_helpers import ReachSizes as Sizes

import shapeguard
from shapeguard import ShapeError

xops = pytest.importorskip("xformers.ops")
AB = pytest.importorskip("xformers.ops.fmha.attn_bias")
memory_efficient_attention = xops.memory_efficient_attention

pytestmark = pytest.mark.no_shapeguard  # these tests read the traces they open


def qkv(s: Sizes, batch: int | None = None, seq: int | None = None, seq_k: int | None = None):
    torch.manual_seed(0)
    batch = s.batch if batch is None else batch
    seq = s.seq if seq is None else seq
    seq_k = s.seq_k if seq_k is None else seq_k
    q = torch.randn(batch, seq, s.heads, s.d_k)
    k = torch.randn(batch, seq_k, s.heads, s.d_k)
    v = torch.randn(batch, seq_k, s.heads, s.d_k)
    return q, k, v


def run(*args, **kwargs):
    """The call, where the kernel may run (a GPU) or fails (a CPU): its failure is the
    call's own, after the check and the reach."""
    with contextlib.suppress(NotImplementedError):
        return memory_efficient_attention(*args, **kwargs)
    return None


def lines(error) -> list[str]:
    return str(error).splitlines()


def rows_of(reach, index=(0, 0)) -> list:
    return [reach.row(index, i) for i in range(reach.seq_q)]


def runs(keys) -> tuple:
    """The runs of a sorted list of keys (built here, not by the code under test)."""
    out: list[list[int]] = []
    for key in keys:
        if out and out[-1][1] == key:
            out[-1][1] = key + 1
        else:
            out.append([key, key + 1])
    return tuple((a, b) for a, b in out)


# -- the contract, before the call ----------------------------------------------------------------
@SETTING
def test_keys_and_values_of_other_lengths_are_refused_in_named_axes(sizes):
    q, k, v = qkv(sizes)
    values = torch.randn(sizes.batch, sizes.seq_k + 1, sizes.heads, sizes.d_k)
    with pytest.raises(ShapeError) as caught, shapeguard.trace():
        memory_efficient_attention(q, k, values)
    first, at, source, q_line, k_line, v_line, hint = lines(caught.value)
    assert caught.value.kind == "xformers_shape"
    assert first == (
        f"memory_efficient_attention: k.seq_k ({sizes.seq_k}) != values.seq_k ({sizes.seq_k + 1})"
    )
    assert "test_reach_xformers.py" in at
    assert source.strip() == "memory_efficient_attention(q, k, values)"
    assert q_line.split() == [
        "q",
        f"[batch={sizes.batch},",
        f"seq_q={sizes.seq},",
        f"heads={sizes.heads},",
        f"d_k={sizes.d_k}]",
    ]
    assert v_line.split()[0] == "values" and f"seq_k={sizes.seq_k + 1}," in v_line
    assert (
        hint == "  hint: every key needs a value: k and values must have the same sequence length"
    )


@SETTING
def test_a_batch_or_head_count_xformers_would_have_to_broadcast_is_refused(sizes):
    q, k, v = qkv(sizes)
    with pytest.raises(ShapeError) as caught, shapeguard.trace():
        memory_efficient_attention(q, k[:1], v[:1])
    assert lines(caught.value)[0] == (
        f"memory_efficient_attention: k[:1].batch (1) != q.batch ({sizes.batch})"
    )
    assert "xformers does not broadcast" in lines(caught.value)[-1]
    kv_heads = sizes.heads // 2
    with pytest.raises(ShapeError) as caught, shapeguard.trace():
        memory_efficient_attention(q, k[:, :, :kv_heads], v[:, :, :kv_heads])
    assert lines(caught.value)[0] == (
        f"memory_efficient_attention: k[:, :, :kv_heads].heads ({kv_heads}) != q.heads "
        f"({sizes.heads})"
    )
    assert "grouped-query attention" in lines(caught.value)[-1]


@SETTING
def test_a_tensor_bias_that_only_broadcasts_is_refused_with_the_expand_remedy(sizes):
    q, k, v = qkv(sizes)
    bias = torch.zeros(sizes.batch, 1, sizes.seq, sizes.seq_k)
    with pytest.raises(ShapeError) as caught, shapeguard.trace():
        memory_efficient_attention(q, k, v, attn_bias=bias)
    full = f"[batch={sizes.batch}, heads={sizes.heads}, seq_q={sizes.seq}, seq_k={sizes.seq_k}]"
    assert caught.value.kind == "xformers_bias"
    assert lines(caught.value)[0] == (
        f"memory_efficient_attention: the attn_bias tensor is [{sizes.batch}, 1, {sizes.seq}, "
        f"{sizes.seq_k}], but q and k need {full}"
    )
    assert lines(caught.value)[-2].split() == [
        "attn_bias",
        "tensor",
        f"[{sizes.batch},",
        "1,",
        f"{sizes.seq},",
        f"{sizes.seq_k}]",
    ]
    expand = f"{sizes.batch}, {sizes.heads}, {sizes.seq}, {sizes.seq_k}"
    assert f"pass attn_bias.expand({expand}) (a view, no copy)" in lines(caught.value)[-1]
    wrong = torch.zeros(sizes.batch, sizes.heads, sizes.seq_k, sizes.seq + 1)  # transposed
    with pytest.raises(ShapeError) as caught, shapeguard.trace():
        memory_efficient_attention(q, k, v, attn_bias=wrong)
    assert "build it for these sizes" in lines(caught.value)[-1]


@SETTING
def test_a_block_diagonal_bias_over_a_batch_or_other_lengths_is_refused(sizes):
    lengths = [sizes.seq // 2, sizes.seq - sizes.seq // 2]
    mask = AB.BlockDiagonalCausalMask.from_seqlens(lengths)
    q, k, v = qkv(sizes, seq_k=sizes.seq)
    with pytest.raises(ShapeError) as caught, shapeguard.trace():
        memory_efficient_attention(q, k, v, attn_bias=mask)
    assert lines(caught.value)[0] == (
        f"memory_efficient_attention: q.batch ({sizes.batch}) != 1, but a "
        "BlockDiagonalCausalMask packs the sequences along seq in one row"
    )
    assert lines(caught.value)[-2].split(maxsplit=1) == [
        "attn_bias",
        f"BlockDiagonalCausalMask(q_seqlen={lengths}, kv_seqlen={lengths})",
    ]
    short = [n + 1 for n in lengths]
    mask = AB.BlockDiagonalCausalMask.from_seqlens(short)
    q, k, v = qkv(sizes, batch=1, seq=sizes.seq, seq_k=sizes.seq)
    with pytest.raises(ShapeError) as caught, shapeguard.trace():
        memory_efficient_attention(q, k, v, attn_bias=mask)
    assert lines(caught.value)[0] == (
        f"memory_efficient_attention: the BlockDiagonalCausalMask's q_seqlen={short} end at "
        f"{sum(short)}, but q.seq_q is {sizes.seq}"
    )
    assert f"they add up to its seq_q ({sizes.seq})" in lines(caught.value)[-1]


class BHSDAttention(nn.Module):
    """Hands xformers SDPA's [batch, heads, seq, d_k]: a layout swap the shapes allow."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x):
        B, T, C = x.shape  # noqa: N806
        q, k, v = self.qkv(x).split(C, dim=-1)
        q = q.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        with contextlib.suppress(NotImplementedError):  # a CPU: no kernel
            return memory_efficient_attention(q, k, v)
        return None


def test_q_k_v_in_sdpas_layout_are_refused_by_the_declared_head_count():
    s = SETTINGS[0]
    with pytest.raises(ShapeError) as caught, shapeguard.trace():
        BHSDAttention(s.heads * s.d_k, s.heads)(torch.randn(s.batch, s.seq, s.heads * s.d_k))
    assert lines(caught.value)[0] == (
        "memory_efficient_attention: q, k, v look like [batch, heads, seq, d_k]; "
        "memory_efficient_attention takes [batch, seq, heads, d_k]"
    )
    assert "q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)" in lines(caught.value)[-1]


@SETTING
@pytest.mark.parametrize(
    "bias",
    [
        None,
        "tensor",
        AB.LowerTriangularMask(),
        AB.LowerTriangularFromBottomRightMask(),
    ],
    ids=["none", "tensor", "lower_triangular", "bottom_right"],
)
def test_calls_that_fit_are_silent_and_the_kernels_own_failure_is_unchanged(sizes, bias):
    q, k, v = qkv(sizes)
    if bias == "tensor":
        bias = torch.zeros(sizes.batch, sizes.heads, sizes.seq, sizes.seq_k)
    want = None
    try:
        memory_efficient_attention(q, k, v, attn_bias=bias)
    except NotImplementedError as error:
        want = (type(error), str(error))
    with shapeguard.trace() as trace:
        try:
            memory_efficient_attention(q, k, v, attn_bias=bias)
            got = None
        except NotImplementedError as error:
            got = (type(error), str(error))
    assert got == want  # a CPU: xformers' own NotImplementedError, unchanged
    assert trace.findings == []
    assert len(trace.reach) == 1


# -- the reach ---------------------------------------------------------------------------------
def causal_rows(seq_q: int, seq_k: int, shift: int, window: int | None = None) -> list:
    """Query i sees keys j <= i + shift (and, with a window, j > i + shift - window)."""
    rows = []
    for i in range(seq_q):
        keys = [j for j in range(seq_k) if j <= i + shift]
        if window is not None:
            keys = [j for j in keys if j > i + shift - window]
        rows.append(runs(keys))
    return rows


@SETTING
@pytest.mark.parametrize("kind", ["none", "top_left", "bottom_right", "local"])
def test_the_reach_of_a_mask_class_is_recorded_exactly(sizes, kind):
    q, k, v = qkv(sizes)
    bias, shift, window = {
        "none": (None, sizes.seq_k, None),
        "top_left": (AB.LowerTriangularMask(), 0, None),
        "bottom_right": (AB.LowerTriangularFromBottomRightMask(), sizes.seq_k - sizes.seq, None),
        "local": (
            AB.LowerTriangularFromBottomRightLocalAttentionMask(3),
            sizes.seq_k - sizes.seq,
            3,
        ),
    }[kind]
    with shapeguard.trace() as trace:
        run(q, k, v, attn_bias=bias)
    (reach,) = trace.reach
    assert (reach.op, reach.lead, reach.lead_axes) == (
        "memory_efficient_attention",
        (sizes.batch, sizes.heads),
        ("batch", "heads"),
    )
    assert (reach.seq_q, reach.seq_k) == (sizes.seq, sizes.seq_k)
    want = causal_rows(sizes.seq, sizes.seq_k, shift, window)
    assert rows_of(reach) == want
    assert rows_of(reach, (sizes.batch - 1, sizes.heads - 1)) == want


@SETTING
def test_the_reach_of_a_tensor_bias_is_read_per_example_and_head(sizes):
    q, k, v = qkv(sizes)
    bias = torch.zeros(sizes.batch, sizes.heads, sizes.seq, sizes.seq_k)
    bias[1, :, :, -2:] = float("-inf")  # example 1: its last two keys are padding
    bias[0, sizes.heads - 1, :, 0] = torch.finfo(torch.float32).min  # one head hides key 0
    with shapeguard.trace() as trace:
        run(q, k, v, attn_bias=bias)
    (reach,) = trace.reach
    everything = [((0, sizes.seq_k),)] * sizes.seq
    assert rows_of(reach, (0, 0)) == everything
    assert rows_of(reach, (0, sizes.heads - 1)) == [((1, sizes.seq_k),)] * sizes.seq
    assert rows_of(reach, (1, 0)) == [((0, sizes.seq_k - 2),)] * sizes.seq


@SETTING
def test_a_causal_mask_with_a_tensor_bias_adds_both(sizes):
    q, k, v = qkv(sizes, seq_k=sizes.seq)
    bias = torch.zeros(sizes.batch, sizes.heads, sizes.seq, sizes.seq)
    bias[..., 0] = float("-inf")
    with shapeguard.trace() as trace:
        run(q, k, v, attn_bias=AB.LowerTriangularMaskWithTensorBias(bias))
    (reach,) = trace.reach
    want = [runs([j for j in range(1, sizes.seq) if j <= i]) for i in range(sizes.seq)]
    assert rows_of(reach) == want


def block_rows(q_lengths, k_lengths, causal: str, window: int | None = None) -> list:
    """Each packed query sees its own block's keys: all of them, the causal triangle from
    the block's top left or bottom right, or a local window."""
    rows = []
    q0 = k0 = 0
    for nq, nk in zip(q_lengths, k_lengths, strict=True):
        for i in range(nq):
            shift = {"none": nk, "top_left": 0, "bottom_right": nk - nq}[causal]
            keys = [j for j in range(nk) if j <= i + shift]
            if window is not None:
                keys = [j for j in keys if j > i + shift - window]
            rows.append(runs([k0 + j for j in keys]))
        q0, k0 = q0 + nq, k0 + nk
    return rows


@SETTING
@pytest.mark.parametrize(
    "kind, causal, window",
    [
        ("BlockDiagonalMask", "none", None),
        ("BlockDiagonalCausalMask", "top_left", None),
        ("BlockDiagonalCausalFromBottomRightMask", "bottom_right", None),
        ("local", "top_left", 2),
    ],
    ids=["block_diagonal", "causal", "bottom_right", "local"],
)
def test_the_reach_of_a_block_diagonal_bias_is_read_from_its_seqstarts(sizes, kind, causal, window):
    q_lengths = [sizes.seq // 2, sizes.seq - sizes.seq // 2]
    k_lengths = [sizes.seq // 2, sizes.seq_k + 1] if causal == "bottom_right" else q_lengths
    if kind == "local":
        bias = AB.BlockDiagonalMask.from_seqlens(q_lengths).make_local_attention(window)
    else:
        bias = getattr(AB, kind).from_seqlens(q_lengths, k_lengths)
    x = torch.randn(1, sum(q_lengths), sizes.heads, sizes.d_k)
    keys = torch.randn(1, sum(k_lengths), sizes.heads, sizes.d_k)
    with shapeguard.trace() as trace:
        run(x, keys, keys, attn_bias=bias)
    assert trace.findings == []
    (reach,) = trace.reach
    assert (reach.lead, reach.how) == ((1, sizes.heads), "attn_bias")
    assert rows_of(reach) == block_rows(q_lengths, k_lengths, causal, window)


def test_the_reach_of_a_long_packed_batch_keeps_a_bounded_sample():
    lengths = [1500, 1000, 1596]
    x = torch.randn(1, sum(lengths), 2, 8)
    with shapeguard.trace() as trace:
        run(x, x, x, attn_bias=AB.BlockDiagonalCausalMask.from_seqlens(lengths))
    (reach,) = trace.reach
    assert reach.queries is not None and len(reach.queries) == 512
    assert reach.row((0, 0), 1500) == ((1500, 1501),)
    assert reach.row((0, 0), sum(lengths) - 1) == ((2500, sum(lengths)),)


# -- judged like any attention site -----------------------------------------------------------
class CausalXformers(nn.Module):
    """A decoder's attention that says it is causal, run through xformers."""

    is_causal = True

    def __init__(self, d_model: int, n_heads: int, bias) -> None:
        super().__init__()
        self.n_heads, self.bias = n_heads, bias
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x):
        B, T, C = x.shape  # noqa: N806
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, C // self.n_heads).unbind(2)
        out = None
        with contextlib.suppress(NotImplementedError):  # a CPU: no kernel
            out = memory_efficient_attention(q, k, v, attn_bias=self.bias)
        return torch.zeros_like(x) if out is None else out.reshape(B, T, C)


@SETTING
def test_a_causal_module_without_its_triangle_is_found_from_the_trace(sizes):
    d_model = sizes.heads * sizes.d_k
    x = torch.randn(sizes.batch, sizes.seq, d_model)
    with shapeguard.trace(mode="warn") as trace, pytest.warns(shapeguard.ShapeWarning):
        CausalXformers(d_model, sizes.heads, None)(x)
    (found,) = trace.findings
    assert found.kind == "reach_future" and found.op == "memory_efficient_attention"
    assert f"over [batch={sizes.batch}, heads={sizes.heads}, seq_q={sizes.seq}" in found.relation
    assert "CausalXformers.is_causal is True" in found.relation
    with shapeguard.trace(mode="warn") as trace:
        CausalXformers(d_model, sizes.heads, AB.LowerTriangularMask())(x)
    assert trace.findings == []


# -- the wrapper ---------------------------------------------------------------------------------
def test_memory_efficient_attention_is_wrapped_only_while_a_trace_is_open(monkeypatch):
    user = types.ModuleType("user_xformers_model")
    user.memory_efficient_attention = memory_efficient_attention
    monkeypatch.setitem(sys.modules, "user_xformers_model", user)
    fmha = sys.modules["xformers.ops.fmha"]
    original = fmha.memory_efficient_attention
    with shapeguard.trace():
        assert xops.memory_efficient_attention is not original
        assert user.memory_efficient_attention.__wrapped__ is original
    assert xops.memory_efficient_attention is original
    assert (
        user.memory_efficient_attention is original and fmha.memory_efficient_attention is original
    )
    s = SETTINGS[0]
    q, k, v = qkv(s)
    with pytest.raises(ShapeError), shapeguard.trace():
        user.memory_efficient_attention(q, k, v[:, :2])  # refused before the kernel
    assert (
        user.memory_efficient_attention is original and xops.memory_efficient_attention is original
    )


def test_the_reach_of_padded_keys_hides_each_blocks_padding():
    # A decode step over a padded cache: each sequence's keys in a block of 6, of which
    # the first 4 and 2 are real; the query sees its sequence's real keys up to its offset.
    bias = AB.BlockDiagonalCausalWithOffsetPaddedKeysMask.from_seqlens(
        q_seqlen=[1, 1], kv_padding=6, kv_seqlen=[4, 2]
    )
    q = torch.randn(1, 2, 3, 8)
    keys = torch.randn(1, 12, 3, 8)
    with shapeguard.trace() as trace:
        run(q, keys, keys, attn_bias=bias)
    (reach,) = trace.reach
    assert rows_of(reach) == [((0, 4),), ((6, 8),)]
