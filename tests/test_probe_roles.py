"""The probes read input roles from axis provenance: token ids, padding masks by how the
module applies them, dict and dataclass batches, a memory as long as the target, images.
Each probe catches a bug in two code styles, and its clean counterpart passes.

Sizes are pairwise distinct: batch 3, seq 7, heads 2, d_k 5 (d_model 10), vocab 50.
"""

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shapeguard._probes.check import check, run_probes

pytestmark = pytest.mark.no_shapeguard

B, S, H, DK, V = 3, 7, 2, 5, 50
D = H * DK


def result(report, name):
    return next(r for r in report.results if r.name == name)


def statuses(report):
    return {r.name: r.status for r in report.results}


def ids(batch=B, seq=S, seed=0):
    return torch.randint(3, V, (batch, seq), generator=torch.Generator().manual_seed(seed))


def keep_mask(lengths, seq=S, left=False):
    """[batch, seq], 1 = a real token; padding on the right (or the left)."""
    pos = torch.arange(seq)[None, :]
    n = torch.tensor(lengths)[:, None]
    return (pos >= seq - n if left else pos < n).long()


class TinyLM(nn.Module):
    """Token ids -> embeddings -> one attention block -> logits, causal or not, with an
    optional padding mask (1 = keep) and one optional bug."""

    def __init__(self, causal=True, bug=None, sdpa=False):
        super().__init__()
        self.n_heads, self.d_k, self.d_model = H, DK, D
        self.causal, self.bug, self.sdpa = causal, bug, sdpa
        self.embed = nn.Embedding(V, D)
        self.pos = nn.Parameter(torch.randn(32, D) * 0.1)
        self.W_q = nn.Linear(D, D)
        self.W_k = nn.Linear(D, D)
        self.W_v = nn.Linear(D, D)
        self.W_o = nn.Linear(D, D)
        self.head = nn.Linear(D, V)

    def forward(self, input_ids, attention_mask=None):
        batch, seq = input_ids.shape
        pos = self.pos if self.bug == "full_positions" else self.pos[:seq]
        x = (
            self.embed(input_ids) + pos[:seq]
            if self.bug != "full_positions"
            else (self.embed(input_ids) + pos[:S])
        )
        if self.bug == "roll_batch":
            x = x + 0.5 * x.roll(1, dims=0)  # each example sees the previous one
        q = self.W_q(x).view(batch, seq, H, DK).transpose(1, 2)
        k = self.W_k(x).view(batch, seq, H, DK).transpose(1, 2)
        v = self.W_v(x).view(batch, seq, H, DK).transpose(1, 2)
        keep = torch.ones(seq, seq, dtype=torch.bool)
        if self.causal:
            keep = keep.tril(1 if self.bug == "off_by_one" else 0)
        keep = keep[None, None]
        if attention_mask is not None:
            keep = keep & (attention_mask[:, None, None, :] != 0)
        if self.sdpa:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(DK)
            scores = scores.masked_fill(~keep, float("-inf"))
            out = F.softmax(scores, dim=-1) @ v
        out = self.W_o(out.transpose(1, 2).reshape(batch, seq, D))
        if self.bug == "pool_all":
            out = out + out.mean(dim=1, keepdim=True)  # pools the padded positions too
        if self.bug == "cumsum":
            out = out.cumsum(dim=1) / (torch.arange(seq)[None, :, None] + 1)
        return self.head(out)


# -- token ids get real probes ----------------------------------------------------------------
@pytest.mark.parametrize("sdpa", [False, True], ids=["matmul", "sdpa"])
def test_a_token_id_lm_gets_every_probe_that_applies(sdpa):
    report = check(TinyLM(sdpa=sdpa), ids(), attention_mask=keep_mask([S, 5, 4]))
    assert report.passed, report.render(width=160)
    ran = {r.name for r in report.results if r.status == "passed"}
    assert {
        "batch independence",
        "sub-batch consistency",
        "causality",
        "key-padding invariance",
        "length change",
    } <= ran
    causal = result(report, "causality")
    assert causal.message.startswith(
        "changing tokens t..6 of input_ids, for each t from 1 to 6, left the outputs of "
        "tokens 0..t-1 unchanged"
    )
    padding = result(report, "key-padding invariance")
    assert padding.message.startswith(
        "changing input_ids at the padded positions 4..6 of example 2 (its own padding: "
        "attention_mask marks it 0, as "
    )
    batch = result(report, "batch independence")
    assert batch.message.startswith(
        "changing example 2 of 3 (input_ids; its padding in attention_mask) left the other "
        "examples' outputs unchanged"
    )


def test_an_lm_declared_causal_without_a_mask_fails_causality_with_its_reason():
    report = check(TinyLM(causal=False), ids(), causal=True)
    failed = result(report, "causality")
    assert failed.status == "failed"
    assert failed.message.startswith(
        "changing tokens 1..6 of input_ids (example 0) moved the output of token 0 by "
    )
    assert "the module is causal (declared with causal=True)" in failed.message


@dataclass
class Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor


class BatchLM(TinyLM):
    def forward(self, batch):  # a dict or a dataclass
        get = batch.get if isinstance(batch, dict) else lambda k: getattr(batch, k)
        return super().forward(get("input_ids"), get("attention_mask"))


@pytest.mark.parametrize("kind", ["dict", "dataclass"])
def test_dict_and_dataclass_batches_are_probed_input_by_input(kind):
    parts = {"input_ids": ids(), "attention_mask": keep_mask([S, 6, 4])}
    batch = parts if kind == "dict" else Batch(**parts)
    report = run_probes(BatchLM(), (batch,), {})
    assert report.passed, report.render(width=160)
    assert result(report, "batch independence").message.startswith(
        "changing example 2 of 3 (batch.input_ids; its padding in batch.attention_mask)"
    )
    assert result(report, "key-padding invariance").status == "passed"
    bug = run_probes(BatchLM(bug="roll_batch"), (batch,), {})
    assert result(bug, "batch independence").status == "failed"


# -- padding semantics come from how the mask is used -----------------------------------------
class PadAttention(nn.Module):
    """The newcomer's tutorial MHA: masked_fill(pad_mask[:, None, None, :] == 0, -inf);
    `inverted` is the copy with the polarity bug."""

    def __init__(self, inverted=False):
        super().__init__()
        self.n_heads, self.d_k, self.d_model = H, DK, D
        self.inverted = inverted
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(D, D) for _ in range(4))

    def forward(self, x, pad_mask):
        batch, seq, _ = x.shape
        q, k, v = (
            w(x).view(batch, seq, H, DK).transpose(1, 2) for w in (self.W_q, self.W_k, self.W_v)
        )
        scores = q @ k.transpose(-2, -1) / math.sqrt(DK)
        hide = pad_mask[:, None, None, :] == (1 if self.inverted else 0)
        scores = scores.masked_fill(hide, float("-inf"))
        out = F.softmax(scores, dim=-1) @ v
        return self.W_o(out.transpose(1, 2).reshape(batch, seq, D))


def test_a_correct_keep_mask_passes_and_the_inverted_copy_is_the_trace_s_finding():
    x, mask = torch.randn(B, S, D), keep_mask([S, 5, 6])
    good = check(PadAttention(), x, mask)
    assert good.passed, good.render(width=160)
    assert (
        "pad_mask marks it 0, as masked_fill reads it"
        in result(good, "key-padding invariance").message
    )
    bad = check(PadAttention(inverted=True), x, mask)
    shapes = result(bad, "shape checks")
    assert shapes.status == "failed" and "(mask_polarity)" in shapes.message
    # The probe reads the polarity the same way: True (== 1) hides, as the module applies it.
    assert "hint: padded keys" not in bad.render(width=200)


def test_left_padded_query_rows_are_left_out_of_every_comparison():
    # Eager attention over a left-padded batch gives the pad queries rows that see
    # nothing (uniform or NaN); no probe compares them.
    report = check(TinyLM(), ids(), attention_mask=keep_mask([S, 4, 5], left=True))
    assert report.passed, report.render(width=160)
    assert result(report, "causality").status == "passed"
    assert result(report, "length change").status == "passed"


def test_key_padding_catches_padded_keys_that_still_reach_the_real_tokens():
    from test_probes import Attention

    mask = keep_mask([S, 5, 4])[:, None, None, :]
    report = check(Attention("mask_after_softmax"), torch.randn(B, S, 33), mask=mask)
    failed = result(report, "key-padding invariance")
    assert failed.status == "failed", report.render(width=160)
    assert "moved the real tokens' outputs by " in failed.message
    assert "\n  first seen at softmax at " in failed.message
    assert "test_probes.py:" in failed.op
    assert "hint: padded tokens still reach the real ones" in failed.message


def test_a_pooling_over_the_padded_positions_is_no_key_padding_failure():
    # The mask hides the padded keys from the attention; the mean over every position
    # after it is the module's own mixing, which no mask promises to hide.
    report = check(TinyLM(causal=False, bug="pool_all"), ids(), attention_mask=keep_mask([S, 5, 4]))
    got = result(report, "key-padding invariance")
    assert got.status == "inconclusive", report.render(width=160)
    assert got.message.startswith("the padded positions reach the real tokens through mean at ")
    assert "test_probe_roles.py:" in got.message.splitlines()[0]
    assert (
        "(TinyLM) (a reduction over the positions), not through attention: the mask does "
        "not promise key-padding invariance here" in got.message
    )


# -- causal intent, tested strictly ----------------------------------------------------------------
@pytest.mark.parametrize("sdpa", [False, True], ids=["masked_fill", "sdpa"])
def test_a_causal_mask_off_by_one_is_causal_intent_and_fails_causality(sdpa):
    report = check(TinyLM(bug="off_by_one", sdpa=sdpa), ids())
    failed = result(report, "causality")
    assert failed.status == "failed", report.render(width=160)
    assert failed.message.startswith(
        "changing tokens 1..6 of input_ids (example 0) moved the output of token 0 by "
    )
    assert "(a mask near the diagonal in " in failed.message
    assert "never j > i + 1" in failed.message


def test_causality_is_tested_at_every_split():
    class LateLeak(TinyLM):
        def forward(self, input_ids, attention_mask=None):
            out = super().forward(input_ids, attention_mask)
            # Only the second-to-last token sees the last one: a split in the middle misses it.
            leak = torch.zeros_like(out)
            leak[:, -2] = out[:, -1]
            return out + leak

    failed = result(check(LateLeak(), ids()), "causality")
    assert failed.status == "failed"
    assert failed.message.startswith(
        "changing tokens 6..6 of input_ids (example 0) moved the output of token 5 by "
    )


# -- every probe: a bug in two styles, a clean counterpart ----------------------------------
def test_sub_batch_catches_an_output_scaled_by_the_batch_size_and_a_batch_sized_buffer():
    class Scaled(TinyLM):
        def forward(self, input_ids, attention_mask=None):
            return super().forward(input_ids, attention_mask) * input_ids.shape[0]

    class Buffered(TinyLM):
        def __init__(self):
            super().__init__()
            self.register_buffer("offset", torch.randn(B, 1, 1))  # fits this batch only

        def forward(self, input_ids, attention_mask=None):
            return super().forward(input_ids, attention_mask) + self.offset

    silent = result(check(Scaled(), ids()), "sub-batch consistency")
    assert silent.status == "failed"
    # 1 of 3: 2 is the head count, and a cut must not coincide with another size
    assert silent.message.startswith(
        "running the first 1 of 3 examples alone moved their outputs by"
    )
    loud = result(check(Buffered(), ids()), "sub-batch consistency")
    assert loud.status == "failed"
    # [3, 1, 1] + [1, seq, vocab] broadcasts: the batch of one comes out as three
    assert loud.message.startswith(
        "running the first 1 of 3 examples alone moved their outputs by inf (the output is "
        "[3, 7, 50] where [1, 7, 50] was expected)"
    )
    assert result(check(TinyLM(), ids()), "sub-batch consistency").status == "passed"


def test_token_permutation_catches_a_merge_and_an_order_dependent_sum():
    from test_probes import Attention

    merge = result(
        check(Attention("merge"), torch.randn(B, S, 33)), "token-permutation equivariance"
    )
    assert merge.status == "failed"

    class Cumulative(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = Attention()

        def forward(self, x):
            return self.attn(x).cumsum(dim=1)

    order = result(check(Cumulative(), torch.randn(B, S, 33)), "token-permutation equivariance")
    assert order.status == "failed"
    assert order.message.startswith("permuting the tokens moved the outputs (permuted back) by ")
    clean = result(check(Attention(), torch.randn(B, S, 33)), "token-permutation equivariance")
    assert clean.status == "passed"


class Packed(nn.Module):
    """Self-attention with one packed qkv projection split in three; `merge` forgets the
    transpose before merging the heads."""

    def __init__(self, merge=False):
        super().__init__()
        self.n_heads, self.d_k, self.d_model = H, DK, D
        self.merge = merge
        self.qkv = nn.Linear(D, 3 * D)
        self.out = nn.Linear(D, D)

    def forward(self, x):
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(batch, seq, H, DK).transpose(1, 2) for t in (q, k, v))
        ctx = F.scaled_dot_product_attention(q, k, v)
        ctx = (
            ctx.reshape(batch, seq, D) if self.merge else ctx.transpose(1, 2).reshape(batch, seq, D)
        )
        return self.out(ctx)


def test_head_permutation_catches_a_merge_without_transpose_in_packed_and_separate_styles():
    from test_probes import Attention

    separate = result(
        check(Attention("merge"), torch.randn(B, S, 33)), "head-permutation invariance"
    )
    packed = result(check(Packed(merge=True), torch.randn(B, S, D)), "head-permutation invariance")
    for failed in (separate, packed):
        assert failed.status == "failed"
        assert "hint: heads are not kept apart between the split and the merge" in failed.message
    assert packed.message.startswith("permuting the 2 heads of Packed (Q/K/V projection rows")
    clean = result(check(Packed(), torch.randn(B, S, D)), "head-permutation invariance")
    assert clean.status == "passed"


def test_length_change_is_inconclusive_on_a_full_length_position_table():
    # `x + pos[:S]` takes one length only, as a learned absolute table added whole (ViT's)
    # does by design: the shorter run raises, which is no counterexample.
    got = result(check(TinyLM(bug="full_positions"), ids()), "length change")
    assert got.status == "inconclusive"
    assert got.message.startswith("the module rejects the probe's input (seq 4 instead of 7): ")
    assert result(check(TinyLM(), ids()), "length change").status == "passed"


def test_batch_independence_catches_examples_that_see_each_other_in_two_styles():
    from test_probes import Attention

    mean = result(check(Attention("batch_norm"), torch.randn(B, S, 33)), "batch independence")
    roll = result(check(TinyLM(bug="roll_batch"), ids()), "batch independence")
    for failed in (mean, roll):
        assert failed.status == "failed"
        assert "hint: something mixes examples" in failed.message
    assert result(check(TinyLM(), ids()), "batch independence").status == "passed"


# -- a batch of one is grown to two ----------------------------------------------------------
GROWN = (
    "a batch of one grown to two with a second example made like example 0 (other ids and "
    "data, the same masks): "
)


def test_a_batch_of_one_gets_both_batch_probes_beside_a_second_example():
    report = check(TinyLM(), ids(batch=1), attention_mask=keep_mask([4]))
    independence = result(report, "batch independence")
    assert independence.status == "passed"
    assert independence.message.startswith(
        GROWN + "changing example 1 of 2 (input_ids; its padding in attention_mask) left the "
        "other examples' outputs unchanged"
    )
    alone = result(report, "sub-batch consistency")
    assert alone.status == "passed"
    assert alone.message.startswith(
        GROWN + "running the first 1 of 2 examples alone left their outputs unchanged"
    )


def test_a_batch_of_one_still_catches_examples_that_see_each_other_in_two_styles():
    from test_probes import Attention

    mean = result(check(Attention("batch_norm"), torch.randn(1, S, 33)), "batch independence")
    roll = result(check(TinyLM(bug="roll_batch"), ids(batch=1)), "batch independence")
    for failed in (mean, roll):
        assert failed.status == "failed"
        assert failed.message.startswith(GROWN + "changing example 1 of 2 (")
        assert "hint: something mixes examples" in failed.message


def test_a_batch_of_one_still_catches_outputs_that_depend_on_the_batch_in_two_styles():
    class Scaled(TinyLM):
        def forward(self, input_ids, attention_mask=None):
            return super().forward(input_ids, attention_mask) * input_ids.shape[0]

    class Centered(TinyLM):
        def forward(self, input_ids, attention_mask=None):
            out = super().forward(input_ids, attention_mask)
            return out - 0.5 * out.mean(dim=0, keepdim=True)  # the batch's mean

    for model in (Scaled(), Centered()):
        failed = result(check(model, ids(batch=1)), "sub-batch consistency")
        assert failed.status == "failed"
        assert failed.message.startswith(
            GROWN + "running the first 1 of 2 examples alone moved their outputs by "
        )


def test_a_batch_of_one_whose_output_mixes_its_examples_says_so_grown_to_two():
    class Pooled(TinyLM):  # one row for the whole batch: no example's output to compare
        def forward(self, input_ids, attention_mask=None):
            return super().forward(input_ids, attention_mask).mean(dim=0)

    got = result(check(Pooled(), ids(batch=1)), "batch independence")
    assert got.status == "skipped" and not got.applicable
    assert got.message.startswith("a batch of one, grown to two: no output has a batch axis")


def test_the_grown_batch_is_traced_with_checks_on_inside_the_probes_off_block():
    """The probes run inside `check`'s own `disabled()` block; the retrace of a grown
    batch still reads its axes from provenance, unless checks were off for the whole
    `check` (the user's off switch)."""
    import shapeguard
    from shapeguard import _config
    from shapeguard._probes.traced import trace_for_probes

    model = TinyLM()
    first = trace_for_probes(model, (ids(batch=2),), {})
    assert first.on and first.out_axes == ("batch", "seq_q", None)
    with _config.disabled():
        again = trace_for_probes(model, (ids(batch=2),), {}, like=first)
    assert again.out_axes == first.out_axes
    with shapeguard.disabled():
        off = trace_for_probes(model, (ids(batch=2),), {})
        again = trace_for_probes(model, (ids(batch=2),), {}, like=off)
    assert not off.on and off.out_axes == () and again.out_axes == ()


# -- memory vs target, images ---------------------------------------------------------------
def test_a_memory_as_long_as_the_target_is_its_own_sequence():
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(D, H, 16, batch_first=True).eval()
    tgt, memory = torch.randn(B, S, D), torch.randn(B, S, D)
    mask = nn.Transformer.generate_square_subsequent_mask(S)
    report = check(layer, tgt, memory, tgt_mask=mask, tgt_is_causal=True)
    assert report.passed, report.render(width=160)
    assert result(report, "causality").status == "passed"
    assert result(report, "length change").status == "passed"


def test_an_image_model_s_positions_are_made_inside_and_not_shortened():
    class Patches(nn.Module):
        def __init__(self):
            super().__init__()
            self.n_heads, self.d_k, self.d_model = H, DK, D
            self.patch = nn.Conv2d(3, D, 4, stride=4)
            self.attn = nn.MultiheadAttention(D, H, batch_first=True)

        def forward(self, pixel_values):
            x = self.patch(pixel_values).flatten(2).transpose(1, 2)  # [batch, patches, D]
            return self.attn(x, x, x, need_weights=False)[0]

    report = check(Patches(), torch.randn(B, 3, 12, 12))
    assert report.passed, report.render(width=160)
    length = result(report, "length change")
    assert length.status == "skipped" and not length.applicable
    assert length.message.startswith("the outputs keep none of the inputs' token axes (height of")
    assert result(report, "batch independence").status == "passed"


# -- sharded state -----------------------------------------------------------------------
_DTENSOR_SCRIPT = """
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from test_probes import Attention, B, S, D
from shapeguard._probes.check import check
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
try:
    model = Attention()
    plan = {"W_q": ColwiseParallel(), "W_k": ColwiseParallel(), "W_v": ColwiseParallel(),
            "out": RowwiseParallel()}
    parallelize_module(model, init_device_mesh("cpu", (1,)), plan)
    for r in check(model, torch.randn(B, S, D)).results:
        print(f"{r.name}|{r.status}|{r.message.splitlines()[0]}")
finally:
    dist.destroy_process_group()
"""


def test_dtensor_weights_skip_the_probes_that_cannot_apply_with_the_reason():
    import os
    import pathlib
    import subprocess
    import sys

    pytest.importorskip("torch.distributed.tensor")
    here = pathlib.Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parent), str(here)])}
    done = subprocess.run(
        [sys.executable, "-c", _DTENSOR_SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {
        name: (status, message)
        for name, status, message in (
            line.split("|", 2) for line in done.stdout.splitlines() if line.count("|") >= 2
        )
    }
    assert rows["head-permutation invariance"] == (
        "inconclusive",
        "its parameter W_q.weight is a DTensor (S(0)): permuting its rows would move heads "
        "across shards",
    )
    assert rows["batch independence"][0] == "passed"
    assert rows["length change"][0] == "passed"
    assert not any(status == "failed" for status, _ in rows.values())


# -- token ids drawn from the table that reads them -------------------------------------------
class PositionsFromIds(TinyLM):
    """FSMT's layout: positions made from the ids (counted over the real tokens), read by a
    small position table first, then the ids by a large vocabulary."""

    VOCAB, ROWS = 4000, 16

    def __init__(self, bug=None):
        super().__init__(causal=False, bug=bug)
        self.embed = nn.Embedding(self.VOCAB, D)
        self.positions = nn.Embedding(self.ROWS, D)

    def forward(self, input_ids, attention_mask=None):
        real = input_ids.ne(1).long()
        at = self.positions(torch.cumsum(real, dim=1) * real + 1)
        x = self.embed(input_ids) + at
        if self.bug == "roll_batch":
            x = x + 0.5 * x.roll(1, dims=0)
        batch, seq, _ = x.shape
        q, k, v = (
            w(x).view(batch, seq, H, DK).transpose(1, 2) for w in (self.W_q, self.W_k, self.W_v)
        )
        keep = (attention_mask[:, None, None, :] != 0) if attention_mask is not None else None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.head(self.W_o(out.transpose(1, 2).reshape(batch, seq, D)))


def test_new_ids_come_from_the_table_that_reads_the_ids_not_from_positions_made_of_them():
    many = torch.randint(100, 4000, (B, S), generator=torch.Generator().manual_seed(0))
    report = check(PositionsFromIds(), many, attention_mask=keep_mask([S, 5, 4]))
    assert statuses(report)["batch independence"] == "passed", report.render(width=200)
    assert result(report, "key-padding invariance").status == "passed"
    assert report.passed and not report.inconclusive, report.render(width=200)
    roll = result(
        check(PositionsFromIds(bug="roll_batch"), many, attention_mask=keep_mask([S, 5, 4])),
        "batch independence",
    )
    assert roll.status == "failed" and "hint: something mixes examples" in roll.message
