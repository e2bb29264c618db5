"""FlexAttention and packed attention in a trace (issue 28, part 5): a BlockMask checked
against q and k before torch runs the call, the reach of its `mask_mod` evaluated on the
traced sizes, and the reach of packed sequences from `cu_seqlens`, recorded and judged.

The keys each query must see are built by hand (loops over positions and documents, not
the code under test), at pairwise distinct, coincident and realistic sizes.
"""

import contextlib
import dataclasses
import sys
import types
import warnings

import pytest
import torch
from trace_helpers import REACH_SETTING as SETTING
from trace_helpers import REACH_SETTINGS as SETTINGS
from trace_helpers import ReachSizes as Sizes

import shapeguard
from shapeguard import ShapeError, ShapeWarning
from shapeguard._errors import Violation
from shapeguard._reach import invariants
from shapeguard._reach.packed import runs_of
from shapeguard.attention import flash_attention_varlen

flex = pytest.importorskip("torch.nn.attention.flex_attention")
create_block_mask, flex_attention = flex.create_block_mask, flex.flex_attention

# These tests read the traces they open and provoke findings on purpose.
pytestmark = [
    pytest.mark.no_shapeguard,
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]


def qkv(s: Sizes, seq_k: int | None = None):
    torch.manual_seed(0)
    seq_k = s.seq_k if seq_k is None else seq_k
    q = torch.randn(s.batch, s.heads, s.seq, s.d_k)
    k = torch.randn(s.batch, s.heads, seq_k, s.d_k)
    v = torch.randn(s.batch, s.heads, seq_k, s.d_k)
    return q, k, v


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def traced(q, k, v, block_mask):
    with shapeguard.trace() as trace:
        out = flex_attention(q, k, v, block_mask=block_mask)
    return out, trace


def lines(error) -> list[str]:
    return str(error).splitlines()


# -- BlockMask against q and k ------------------------------------------------------------------
@SETTING
def test_a_mask_made_for_longer_sequences_is_refused_with_the_crop_remedy(sizes):
    q, k, v = qkv(sizes)
    mask = create_block_mask(causal, None, None, sizes.seq + 2, sizes.seq_k + 3, device="cpu")
    with pytest.raises(ShapeError) as caught:
        traced(q, k, v, mask)
    first, at, source, q_line, k_line, mask_line, hint = lines(caught.value)
    assert caught.value.kind == "block_mask_shape"
    assert first == (
        f"flex_attention: block_mask was made for seq_q={sizes.seq + 2}, "
        f"seq_k={sizes.seq_k + 3} (its seq_lengths), but q has seq_q={sizes.seq} and k "
        f"seq_k={sizes.seq_k}"
    )
    assert at.strip().startswith("at ") and "test_flex_reach.py" in at
    assert source.strip() == "out = flex_attention(q, k, v, block_mask=block_mask)"
    assert q_line.split()[:2] == ["q", f"[{sizes.batch},"]
    assert mask_line.split()[0] == "block_mask"
    assert f"seq_q={sizes.seq + 2}, seq_k={sizes.seq_k + 3}]" in mask_line
    assert f"create_block_mask(mask_mod, B, H, {sizes.seq}, {sizes.seq_k})" in hint
    assert f"block_mask._adjust({sizes.seq}, {sizes.seq_k})" in hint


@SETTING
def test_a_mask_made_for_shorter_sequences_is_refused(sizes):
    q, k, v = qkv(sizes)
    mask = create_block_mask(causal, None, None, sizes.seq - 1, sizes.seq_k, device="cpu")
    with pytest.raises(ShapeError) as caught:
        traced(q, k, v, mask)
    assert caught.value.kind == "block_mask_shape"
    hint = lines(caught.value)[-1]
    assert hint == (
        "  hint: it was made for shorter sequences: make it for these sizes: "
        f"create_block_mask(mask_mod, B, H, {sizes.seq}, {sizes.seq_k})"
    )
    assert "_adjust" not in hint  # cropping cannot make a mask longer


@SETTING
@pytest.mark.parametrize("axis", ["batch", "heads"])
def test_a_mask_of_another_batch_or_head_count_is_refused(sizes, axis):
    q, k, v = qkv(sizes)
    other = {"batch": sizes.batch + 1, "heads": sizes.heads + 1}[axis]
    B, H = (other, None) if axis == "batch" else (None, other)  # noqa: N806
    mask = create_block_mask(causal, B, H, sizes.seq, sizes.seq_k, device="cpu")
    with pytest.raises(ShapeError) as caught:
        traced(q, k, v, mask)
    want = sizes.batch if axis == "batch" else sizes.heads
    param = "B" if axis == "batch" else "H"
    assert caught.value.kind == "block_mask_shape"
    assert lines(caught.value)[0] == (
        f"flex_attention: block_mask has {axis}={other}, q has {axis}={want} "
        "(a BlockMask's batch and heads are 1, broadcast, or the query's)"
    )
    assert f"create_block_mask(mask_mod, {param}={want}, ...)" in lines(caught.value)[-1]


def test_a_mask_whose_blocks_do_not_cover_its_lengths_is_refused():
    # from_kv_blocks with seq_lengths given: the lengths match, one block of 128 does not
    # cover 200 queries.
    s = Sizes("long", 2, 2, 200, 200, 8)
    q, k, v = qkv(s)
    ones = torch.ones(1, 1, 1, dtype=torch.int32)
    mask = flex.BlockMask.from_kv_blocks(
        ones, torch.zeros(1, 1, 1, 1, dtype=torch.int32), seq_lengths=(200, 200)
    )
    with pytest.raises(ShapeError) as caught:
        traced(q, k, v, mask)
    assert lines(caught.value)[0] == (
        "flex_attention: block_mask holds 1 query blocks x 1 key blocks of 128 x 128, but "
        "seq_q=200, seq_k=200 need 2 x 2"
    )


@SETTING
@pytest.mark.parametrize(
    "batch, heads", [("q", "q"), (None, None), (1, 1), ("q", None), (None, "q")]
)
def test_masks_that_fit_are_silent_and_outputs_unchanged(sizes, batch, heads):
    q, k, v = qkv(sizes)
    B = sizes.batch if batch == "q" else batch  # noqa: N806
    H = sizes.heads if heads == "q" else heads  # noqa: N806
    mask = create_block_mask(causal, B, H, sizes.seq, sizes.seq_k, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShapeWarning)
        out, trace = traced(q, k, v, mask)
    assert trace.findings == []
    assert torch.equal(out, flex_attention(q, k, v, block_mask=mask))  # bitwise


@SETTING
def test_a_batch_one_mask_whose_mask_mod_reads_b_warns_where_the_blocks_differ(sizes):
    q, k, v = qkv(sizes, seq_k=sizes.seq)
    # Each example its own split into two documents: the mod reads b.
    split = [1 + i % (sizes.seq - 1) for i in range(sizes.batch)]
    cut = torch.tensor(split)

    def documents(b, h, q_idx, kv_idx):
        return (q_idx < cut[b]) == (kv_idx < cut[b])

    def made(B, block=1):  # noqa: N803 (create_block_mask's own name)
        return create_block_mask(documents, B, None, sizes.seq, sizes.seq, "cpu", block)

    # Blocks of one position: every block is full or empty, made for example 0 only.
    with pytest.warns(ShapeWarning) as caught:
        traced(q, k, v, made(None))
    (warning,) = [w.message for w in caught if isinstance(w.message, ShapeWarning)]
    differ = sum(s != split[0] for s in split)
    assert warning.kind == "block_mask_broadcast"
    assert lines(warning)[0] == (
        f"flex_attention: block_mask made for batch=1 is shared by batch={sizes.batch}, but "
        f"its mask_mod reads b: {differ} of {sizes.batch} examples need other blocks than "
        "example 0's (first: example 1, query 0)"
    )
    assert f"create_block_mask(mask_mod, B={sizes.batch}, ...)" in lines(warning)[-1]
    for silent in (made(sizes.batch), made(None, 128)):
        # One mask per example; or one partial block of 128, where the kernel applies
        # the mod to every example: silent.
        _, trace = traced(q, k, v, silent)
        assert trace.findings == []


def test_a_head_one_mask_whose_mask_mod_reads_h_warns():
    s = SETTINGS[0]
    q, k, v = qkv(s, seq_k=s.seq)

    def global_head(b, h, q_idx, kv_idx):
        return (h == 0) | (q_idx >= kv_idx)

    shared = create_block_mask(global_head, None, None, s.seq, s.seq, "cpu", 2)
    with pytest.warns(ShapeWarning, match="3 of 4 heads need other blocks than head 0's"):
        traced(q, k, v, shared)


# -- the reach of a mask_mod ---------------------------------------------------------------------
def expected_rows(s: Sizes, seq_k: int, sees) -> dict:
    """{(b, h, query): runs} built by hand from `sees(b, h, q, k)`."""
    rows = {}
    for b in range(s.batch):
        for h in range(s.heads):
            for query in range(s.seq):
                keys = [key for key in range(seq_k) if sees(b, h, query, key)]
                runs, start = [], None
                for key in range(seq_k + 1):
                    if key in keys and start is None:
                        start = key
                    elif key not in keys and start is not None:
                        runs.append((start, key))
                        start = None
                rows[b, h, query] = tuple(runs)
    return rows


def documents_of(s: Sizes, seq: int) -> torch.Tensor:
    """[batch, seq] document ids: example i packs documents of i % 3 + 1 different sizes."""
    ids = torch.zeros(s.batch, seq, dtype=torch.long)
    for b in range(s.batch):
        cuts = [(seq * (j + 1)) // (b % 3 + 2) for j in range(b % 3 + 1)]
        for cut in cuts:
            ids[b, cut:] += 1
    return ids


MASKS = ["causal", "sliding_window", "documents", "prefix_lm"]


def mask_case(name: str, s: Sizes, seq_k: int):
    """(mask_mod, sees): the mod as users write it, and the same by hand in Python ints."""
    window = max(1, s.seq // 3)
    prefix = max(1, seq_k // 2)
    ids = documents_of(s, max(s.seq, seq_k))
    if name == "causal":
        return causal, lambda b, h, q, k: q >= k
    if name == "sliding_window":

        def sliding(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx < window)

        return sliding, lambda b, h, q, k: 0 <= q - k < window
    if name == "documents":

        def same_document(b, h, q_idx, kv_idx):
            return ids[b, q_idx] == ids[b, kv_idx]

        return same_document, lambda b, h, q, k: int(ids[b, q]) == int(ids[b, k])

    def prefix_lm(b, h, q_idx, kv_idx):
        return (kv_idx < prefix) | (q_idx >= kv_idx)

    return prefix_lm, lambda b, h, q, k: k < prefix or q >= k


@SETTING
@pytest.mark.parametrize("name", MASKS)
def test_the_reach_of_a_mask_mod_is_recorded_exactly(sizes, name):
    mod, sees = mask_case(name, sizes, sizes.seq_k)
    q, k, v = qkv(sizes)
    mask = create_block_mask(mod, sizes.batch, None, sizes.seq, sizes.seq_k, device="cpu")
    out, trace = traced(q, k, v, mask)
    assert torch.equal(out, flex_attention(q, k, v, block_mask=mask))
    (reach,) = trace.reach
    assert (reach.op, reach.how, reach.lead, reach.lead_axes) == (
        "flex_attention", "block_mask", (sizes.batch, sizes.heads), ("batch", "heads"),
    )  # fmt: skip
    assert (reach.seq_q, reach.seq_k) == (sizes.seq, sizes.seq_k)
    assert reach.location.endswith(f"test_flex_reach.py:{traced.__code__.co_firstlineno + 2}")
    want = expected_rows(sizes, sizes.seq_k, sees)
    got = {
        (b, h, query): reach.row((b, h), query)
        for b in range(sizes.batch)
        for h in range(sizes.heads)
        for query in range(sizes.seq)
    }
    assert got == want
    # Every head alike: stored once; examples too unless their rows differ (documents).
    alike = all(want[key] == want[(0, *key[1:])] for key in want)
    assert reach.stored == (1 if alike else sizes.batch, 1)


def test_without_a_block_mask_every_query_sees_every_key():
    s = SETTINGS[0]
    q, k, v = qkv(s)
    _, trace = traced(q, k, v, None)
    (reach,) = trace.reach
    assert reach.how == "unmasked"
    assert {reach.row((0, 0), i) for i in range(s.seq)} == {((0, s.seq_k),)}


def test_the_reach_of_a_long_sequence_keeps_a_bounded_sample():
    s = Sizes("long", 2, 4, 4096, 4096, 8)
    mod, sees = mask_case("sliding_window", Sizes("w", 2, 4, 12, 12, 8), 12)  # window 4
    from shapeguard._reach.block_mask import reach_of

    reach = reach_of(mod, s.batch, s.heads, s.seq, s.seq_k)
    assert reach is not None and reach.queries is not None
    assert 8 <= len(reach.queries) <= 512 and reach.stored == (1, 1)
    for query in (0, 1, 4095, *reach.queries[::37]):
        if query in reach.queries:
            assert reach.row((0, 0), query) == ((max(0, query - 3), query + 1),)


# -- a mask_mod that lets the future in, judged -----------------------------------------------------
def test_a_mask_mod_that_sees_later_keys_is_recorded_as_it_is():
    """`q_idx <= kv_idx` (the comparison turned round): every query sees itself and every
    later key, no earlier one, and the trace keeps exactly that for the judge."""
    s = SETTINGS[0]
    q, k, v = qkv(s, seq_k=s.seq)

    def turned(b, h, q_idx, kv_idx):
        return q_idx <= kv_idx  # <- the future is let in

    _, trace = traced(q, k, v, create_block_mask(turned, None, None, s.seq, s.seq, device="cpu"))
    (reach,) = trace.reach
    assert [reach.row((0, 0), i) for i in range(s.seq)] == [((i, s.seq),) for i in range(s.seq)]


def test_the_judges_findings_at_a_flex_site_are_reported(monkeypatch):
    """The site hands its reach to `invariants.judge` and reports what comes back: a judge
    that flags keys past each query's position (as a causal model's `reach_future` does)
    makes the flex call warn, with the flagged cells kept on the recorded reach."""
    s = SETTINGS[0]

    def judge(call, reach):
        marks = tuple(
            (
                (0, 0),
                query,
                tuple((max(a, query + 1), b) for a, b in reach.row((0, 0), query) if b > query + 1),
            )
            for query in reach.kept_queries
        )
        marks = tuple(m for m in marks if m[2])
        if not marks:
            return reach, []
        found = Violation(
            "reach_future", f"{reach.op}: query {marks[0][1]} sees later keys", (), "causal"
        )
        return dataclasses.replace(reach, marks=marks), [found]

    monkeypatch.setattr(invariants, "judge", judge)
    q, k, v = qkv(s, seq_k=s.seq)

    def turned(b, h, q_idx, kv_idx):
        return q_idx <= kv_idx

    with pytest.warns(ShapeWarning, match="flex_attention: query 0 sees later keys"):
        _, trace = traced(
            q, k, v, create_block_mask(turned, None, None, s.seq, s.seq, device="cpu")
        )
    (reach,) = trace.reach
    assert reach.marks[0] == ((0, 0), 0, ((1, s.seq),))
    _, trace = traced(q, k, v, create_block_mask(causal, None, None, s.seq, s.seq, device="cpu"))
    assert trace.findings == [] and trace.reach[0].marks == ()


# -- packed sequences ---------------------------------------------------------------------------
def packed_rows(cu: list[int], causal_: bool, window: tuple[int, int]) -> list[tuple]:
    """Each packed query's keys by hand: its own document, causal and window by position."""
    rows = []
    for doc in range(len(cu) - 1):
        for p in range(cu[doc + 1] - cu[doc]):
            keys = [
                cu[doc] + j
                for j in range(cu[doc + 1] - cu[doc])
                if (not causal_ or j <= p)
                and (window[0] < 0 or j >= p - window[0])
                and (window[1] < 0 or j <= p + window[1])
            ]
            rows.append(((keys[0], keys[-1] + 1),) if keys else ())
    return rows


@SETTING
@pytest.mark.parametrize("causal_, window", [(False, (-1, -1)), (True, (-1, -1)), (True, (2, 0))])
def test_the_reach_of_packed_sequences_is_recorded_exactly(sizes, causal_, window):
    lengths = [sizes.seq - (i * (sizes.seq - 1)) // sizes.batch for i in range(sizes.batch)]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    bounds = torch.tensor(cu, dtype=torch.int32)
    torch.manual_seed(0)
    x = torch.randn(cu[-1], sizes.heads, sizes.d_k)
    with shapeguard.trace() as trace:
        out = flash_attention_varlen(
            x, x, x, bounds, bounds, max(lengths), max(lengths), causal=causal_,
            window_size=window, backend="sdpa",
        )  # fmt: skip
    plain = flash_attention_varlen(
        x, x, x, bounds, bounds, max(lengths), max(lengths), causal=causal_,
        window_size=window, backend="sdpa",
    )  # fmt: skip
    assert torch.equal(out, plain)
    (reach,) = trace.reach
    assert (reach.op, reach.how, reach.lead, reach.stored) == (
        "flash_attention_varlen", "cu_seqlens", (sizes.heads,), (1,),
    )  # fmt: skip
    assert [reach.row((0,), t) for t in range(cu[-1])] == packed_rows(cu, causal_, window)


def test_cross_lengths_align_causal_to_the_end_of_each_sequence():
    # Two sequences of 2 queries over 4 and 3 keys: query p sees keys up to p + n_k - n_q.
    cu_q, cu_k = (0, 2, 4), (0, 4, 7)
    assert [runs_of(cu_q, cu_k, t, causal=True) for t in range(4)] == [
        ((0, 3),), ((0, 4),), ((4, 6),), ((4, 7),),
    ]  # fmt: skip


def test_torch_varlen_attn_is_read_before_its_kernel_runs():
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    x = torch.randn(8, 2, 16)
    # No CPU kernel: torch fails, after the reach was read.
    with shapeguard.trace() as trace, contextlib.suppress(NotImplementedError, RuntimeError):
        varlen.varlen_attn(x, x, x, cu, cu, 5, 5, window_size=(-1, 0))
    (reach,) = trace.reach
    assert (reach.op, reach.how) == ("varlen_attn", "cu_seqlens")
    assert [reach.row((0,), t) for t in range(8)] == packed_rows([0, 3, 8], True, (-1, -1))


# -- the wrapper ----------------------------------------------------------------------------
def test_flex_attention_is_wrapped_only_while_a_trace_is_open(monkeypatch):
    user = types.ModuleType("user_flex_model")
    user.flex_attention = flex_attention
    monkeypatch.setitem(sys.modules, "user_flex_model", user)
    original = flex.flex_attention
    with shapeguard.trace():
        assert flex.flex_attention is not original
        assert user.flex_attention.__wrapped__ is original
    assert flex.flex_attention is original and user.flex_attention is original
    with pytest.raises(ShapeError), shapeguard.trace():
        s = SETTINGS[0]
        q, k, v = qkv(s)
        user.flex_attention(
            q, k, v, block_mask=create_block_mask(causal, 2, None, s.seq, s.seq_k, device="cpu")
        )
    assert flex.flex_attention is original and user.flex_attention is original


def test_under_torch_compile_nothing_is_checked_or_recorded():
    s = SETTINGS[0]
    q, k, v = qkv(s)
    mask = create_block_mask(causal, None, None, s.seq, s.seq_k, device="cpu")

    def attend(q, k, v):
        return flex.flex_attention(q, k, v, block_mask=mask)

    with shapeguard.trace() as trace:
        out = torch.compile(attend, backend="eager", fullgraph=True)(q, k, v)
    assert trace.reach == [] and trace.findings == []
    assert torch.allclose(out, flex_attention(q, k, v, block_mask=mask))


# -- transformers models with attn_implementation="flex_attention" ------------------------------
# transformers compiles flex_attention and its block masks (create_block_mask(_compile=True)),
# and torch's compile path warns of its own deprecations (torch.jit.script_method).
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_transformers_flex_attention_models_run_clean():
    """A tiny Llama and a Qwen2 from config with FlexAttention: transformers compiles
    flex_attention, so the trace checks around it and the forward is clean, outputs
    bitwise equal. (Their compile makes this the slowest test here: one size only.)"""
    transformers = pytest.importorskip("transformers")
    for config_class, model_class in (
        (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    ):
        config = config_class(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        )  # fmt: skip
        config._attn_implementation = "flex_attention"
        torch.manual_seed(0)
        model = model_class(config).eval()
        ids = torch.randint(0, 64, (2, 9))
        with torch.no_grad():
            plain = model(ids).logits
            with shapeguard.trace() as trace:
                out = model(ids).logits
        assert trace.findings == [], [str(f) for f in trace.findings]
        assert torch.equal(out, plain)


@SETTING
def test_a_score_mod_that_writes_minus_inf_is_part_of_the_reach(sizes):
    q, k, v = qkv(sizes)
    window = max(1, sizes.seq // 3)

    def causal_by_score(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx >= kv_idx, score, float("-inf"))

    def sliding(b, h, q_idx, kv_idx):
        return q_idx - kv_idx < window

    def bias(score, b, h, q_idx, kv_idx):  # a position bias hides nothing
        return score - (q_idx - kv_idx).abs()

    mask = create_block_mask(sliding, None, None, sizes.seq, sizes.seq_k, device="cpu")
    with shapeguard.trace() as trace:
        flex_attention(q, k, v, score_mod=causal_by_score)
        flex_attention(q, k, v, score_mod=causal_by_score, block_mask=mask)
        flex_attention(q, k, v, score_mod=bias)
    alone, both, biased = trace.reach
    assert (alone.how, both.how, biased.how) == ("score_mod", "block_mask", "score_mod")
    for reach, sees in (
        (alone, lambda b, h, i, j: i >= j),
        (both, lambda b, h, i, j: 0 <= i - j < window),
        (biased, lambda b, h, i, j: True),
    ):
        want = expected_rows(sizes, sizes.seq_k, sees)
        assert {key: reach.row(key[:2], key[2]) for key in want} == want


class CausalFlex(torch.nn.Module):
    """A decoder layer that says it is causal (`is_causal = True`, as transformers' are) and
    masks with a FlexAttention `mask_mod`; the bug's mod reads the indices the wrong way."""

    is_causal = True

    def __init__(self, d_model: int, heads: int, bug: bool):
        super().__init__()
        self.heads, self.bug = heads, bug
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)

    def forward(self, x):
        B, S, d_model = x.shape
        q, k, v = (
            t.view(B, S, self.heads, d_model // self.heads).transpose(1, 2)
            for t in self.qkv(x).chunk(3, dim=-1)
        )

        def keep(b, h, q_idx, kv_idx):
            return q_idx <= kv_idx if self.bug else q_idx >= kv_idx

        mask = create_block_mask(keep, None, None, S, S, device="cpu")
        return flex_attention(q, k, v, block_mask=mask).transpose(1, 2).reshape(B, S, d_model)


@SETTING
@torch.no_grad()  # FlexAttention has no backward on CPU
def test_a_mask_mod_that_lets_the_future_in_a_causal_model_is_found_from_the_trace(sizes):
    torch.manual_seed(0)
    d_model = sizes.heads * sizes.d_k
    x = torch.randn(sizes.batch, sizes.seq, d_model)
    with shapeguard.trace(mode="warn") as trace, warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        CausalFlex(d_model, sizes.heads, bug=True).eval()(x)
    (found,) = [f for f in trace.findings if f.kind == "reach_future"]
    assert found.op == "flex_attention"
    assert "later" in found.relation and "hint:" in found.message
    with shapeguard.trace(mode="warn") as trace:
        CausalFlex(d_model, sizes.heads, bug=False).eval()(x)
    assert trace.findings == []
    assert [trace.reach[0].row((0, 0), i) for i in range(sizes.seq)] == [
        ((0, i + 1),) for i in range(sizes.seq)
    ]
