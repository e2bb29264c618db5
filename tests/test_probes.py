"""shapeguard.check's probes: each catches its bug class, points at the op, and leaves
the caller's module, RNG and modes exactly as they were.

Sizes are pairwise distinct (batch 2, heads 3, seq 5, d_k 11, d_model 33) unless a
test needs two of them to coincide.
"""

import copy
import math
import random
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shapeguard import ContractError
from shapeguard._probes.check import check, run_probes

B, H, S, DK = 2, 3, 5, 11
D = H * DK  # 33


def statuses(report):
    return {r.name: r.status for r in report.results}


def result(report, name):
    return next(r for r in report.results if r.name == name)


class Attention(nn.Module):
    """Hand-written self-attention with an optional mask and one optional bug."""

    def __init__(self, bug=None):
        super().__init__()
        self.d_model, self.n_heads, self.d_k = D, H, DK
        self.bug = bug
        self.W_q = nn.Linear(D, D)
        self.W_k = nn.Linear(D, D)
        self.W_v = nn.Linear(D, D)
        self.out = nn.Linear(D, D)
        self.drop = nn.Dropout(0.5)

    def forward(self, x, mask=None):
        batch, seq, _ = x.shape
        Q = self.W_q(x).view(batch, seq, H, DK).transpose(1, 2)
        K = self.W_k(x).view(batch, seq, H, DK).transpose(1, 2)
        V = self.W_v(x).view(batch, seq, H, DK).transpose(1, 2)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(DK)
        if mask is not None and self.bug != "mask_after_softmax":
            scores = scores.masked_fill(mask == 0, float("-inf"))
        attn = self.drop(F.softmax(scores, dim=-1))
        if mask is not None and self.bug == "mask_after_softmax":
            attn = attn.masked_fill(mask == 0, 0.0)  # hides padded keys but keeps them in the sum
        context = attn @ V
        if self.bug == "merge":
            context = context.reshape(batch, seq, D)
        else:
            context = context.transpose(1, 2).reshape(batch, seq, D)
        y = self.out(context)
        if self.bug == "pool":
            y = y + y.mean(dim=1, keepdim=True)  # every token sees the average of all tokens
        if self.bug == "batch_norm":
            y = y - y.mean(dim=0, keepdim=True)  # every example sees the batch average
        return y


def causal(seq=S):
    return torch.ones(seq, seq).tril()


def keep_mask(lengths, seq=S):
    return (torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]).long()[:, None, None, :]


# -- a correct module passes -----------------------------------------------------------
def test_a_correct_module_passes_every_probe_that_applies():
    report = check(Attention(), torch.randn(B, S, D), mask=causal())
    assert report.passed
    assert statuses(report) == {
        "shape checks": "passed",
        "batch independence": "passed",
        "sub-batch consistency": "passed",
        "causality": "passed",
        "key-padding invariance": "skipped",
        "token-permutation equivariance": "skipped",
        "node-relabelling equivariance": "skipped",
        "head-permutation invariance": "passed",
        "length change": "passed",
        "decode consistency": "skipped",
        "reach": "passed",
    }
    assert report.dtype == "float64"
    first = result(report, "causality")
    assert first.message == (
        "changing tokens t..4 of x, for each t from 1 to 4, left the outputs of tokens 0..t-1 "
        f"unchanged (deviation {first.deviation:.1e})"
    )
    assert first.tolerance == 1e-7


# -- each probe catches its bug ----------------------------------------------------------
def test_batch_independence_catches_mixing_across_examples():
    report = check(Attention("batch_norm"), torch.randn(B, S, D))
    failed = result(report, "batch independence")
    assert failed.status == "failed" and not report.passed
    assert failed.message.startswith(
        "changing example 1 of 2 (x) moved the other examples' outputs by "
    )
    assert failed.deviation > 1e-3
    assert failed.op.startswith("sub at ") and failed.op.endswith(
        f"test_probes.py:{_line('y - y.mean(dim=0')} (Attention)"
    )
    assert "hint: something mixes examples" in failed.message


def test_causality_catches_a_leak_from_later_tokens():
    report = check(Attention("pool"), torch.randn(B, S, D), mask=causal())
    failed = result(report, "causality")
    assert failed.status == "failed"
    assert failed.message.startswith(
        "changing tokens 1..4 of x (example 0) moved the output of token 0 by "
    )
    assert "a triangular mask in masked_fill" in failed.message
    assert failed.op.endswith(f"test_probes.py:{_line('y + y.mean(dim=1')} (Attention)")
    assert result(report, "length change").status == "failed"


def test_key_padding_catches_a_mask_applied_after_softmax():
    report = check(Attention("mask_after_softmax"), torch.randn(B, S, D), mask=keep_mask([S, 3]))
    failed = result(report, "key-padding invariance")
    assert failed.status == "failed"
    assert failed.message.startswith(
        "changing x at the padded positions 3, 4 of example 1 (its own padding: mask marks "
        "it 0, as masked_fill after softmax reads it) moved the real tokens' outputs by "
    )
    assert failed.op.startswith("softmax at ")
    assert (
        result(
            check(Attention(), torch.randn(B, S, D), mask=keep_mask([S, 3])),
            "key-padding invariance",
        ).status
        == "passed"
    )


@pytest.mark.no_shapeguard  # warns on purpose
def test_token_permutation_catches_a_sequence_pooling_module():
    report = check(Attention("pool"), torch.randn(B, S, D))
    assert (
        result(report, "token-permutation equivariance").status == "passed"
    )  # pooling is symmetric
    report = check(Attention("merge"), torch.randn(B, S, D))
    failed = result(report, "token-permutation equivariance")
    assert failed.status == "failed"
    assert (
        failed.op.startswith("reshape at ")
        and f"test_probes.py:{_line('context.reshape(batch')}" in failed.op
    )


@pytest.mark.no_shapeguard  # warns on purpose
def test_head_permutation_catches_a_merge_without_transpose():
    report = check(Attention("merge"), torch.randn(B, S, D))
    failed = result(report, "head-permutation invariance")
    assert failed.status == "failed"
    assert failed.message.startswith(
        "permuting the 3 heads of Attention (Q/K/V projection rows, output projection columns) "
        "moved the output by "
    )
    assert "merged by reshape at" in failed.op
    assert result(report, "shape checks").status == "failed"  # the trace saw it too


@pytest.mark.no_shapeguard
def test_a_padding_mask_read_as_seq_by_seq_is_the_trace_s_finding_and_probes_follow_the_module():
    # batch == seq == 5: the module applies the [batch, seq] mask as [seq_q, seq_k]. The
    # trace says so (mask_axis); the probes read the mask as the module applies it.
    x = torch.randn(5, 5, D)
    mask = (torch.arange(5)[None, :] < torch.tensor([5, 3, 4, 2, 5])[:, None]).long()
    report = run_probes(Attention(), (x, mask), {})
    shapes = result(report, "shape checks")
    assert shapes.status == "failed" and "(mask_axis)" in shapes.message
    assert result(report, "sub-batch consistency").status == "passed"


@pytest.mark.no_shapeguard
def test_length_change_is_inconclusive_on_code_that_only_runs_at_one_length():
    class FixedLength(Attention):
        def forward(self, x, mask=None):
            y = super().forward(x, mask)
            return (y.transpose(1, 2) @ self.mix).transpose(1, 2)  # mix: [seq, seq]

    model = FixedLength()
    model.register_buffer("mix", torch.eye(S))  # only this sequence length fits
    got = result(check(model, torch.randn(B, S, D)), "length change")
    # A length the module does not take is no counterexample: a fixed window grid or a
    # learned table of one length rejects it by design. The reason keeps what shapeguard
    # reads of the failure.
    assert got.status == "inconclusive"
    # 4: the first length under 5 that is not another size (3 is the head count)
    assert got.message.splitlines()[0] == (
        "the module rejects the probe's input (seq 4 instead of 5): output = "
        "y.transpose(1, 2) @ mix: y.transpose(1, 2).seq_q (4) != mix.dim -2 (5)"
    )
    assert got.op == f"matmul at tests/test_probes.py:{_line('@ self.mix')} (FixedLength)"
    assert got.message.splitlines()[-1] == (
        "  an input the module does not run is no counterexample"
    )


# -- what decides which probes run --------------------------------------------------------
def test_causal_can_be_declared_or_denied():
    x = torch.randn(B, S, D)
    assert result(check(Attention(), x), "causality").status == "skipped"
    declared = result(check(Attention(), x, causal=True), "causality")
    assert declared.status == "failed"  # declared causal, but nothing masks the future
    assert "declared with causal=True" in declared.message
    assert (
        result(check(Attention(), x, mask=causal(), causal=False), "causality").status == "skipped"
    )


def test_positional_terms_skip_token_permutation():
    class Positional(Attention):
        def __init__(self):
            super().__init__()
            self.pos = nn.Parameter(torch.randn(16, D))

        def forward(self, x, mask=None):
            return super().forward(x + self.pos[: x.size(1)], mask)

    skipped = result(check(Positional(), torch.randn(B, S, D)), "token-permutation equivariance")
    assert skipped.status == "skipped"
    assert skipped.message.startswith("the module has positional terms (__getitem__ at ")


def test_coincident_sizes_no_longer_keep_the_probes_from_running():
    # batch == seq == 5 on a 4-D mask: provenance tells its axes apart (the mask's first
    # axis lines up with the scores' batch, its last with the keys).
    mask = torch.ones(5, 1, 1, 5)
    report = check(Attention(), torch.randn(5, 5, D), mask=mask)
    assert result(report, "batch independence").status == "passed"
    assert result(report, "key-padding invariance").status == "passed"


def test_a_module_that_refuses_float64_is_probed_as_given():
    class Float32Only(Attention):
        def forward(self, x, mask=None):
            return super().forward(x, mask) @ torch.eye(D)  # float32 constant

    report = check(Float32Only(), torch.randn(B, S, D))
    assert report.dtype == "float32" and report.passed
    assert result(report, "batch independence").tolerance == 1e-4


def test_check_wants_a_module():
    with pytest.raises(ContractError, match="shapeguard.check takes an nn.Module, not function"):
        check(lambda x: x, torch.randn(B, S, D))


# -- no side effects -----------------------------------------------------------------------
def _snapshot(model):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        {id(p) for p in model.parameters()},
        {m: m.training for m in model.modules()},
        {n: p.requires_grad for n, p in model.named_parameters()},
    )


def _assert_untouched(model, before):
    state, ids, modes, grads = before
    after = model.state_dict()
    assert after.keys() == state.keys()
    assert all(torch.equal(after[k], v) and after[k].dtype == v.dtype for k, v in state.items())
    assert {id(p) for p in model.parameters()} == ids
    assert {m: m.training for m in model.modules()} == modes
    assert {n: p.requires_grad for n, p in model.named_parameters()} == grads


@pytest.mark.parametrize("copyable", [True, False], ids=["copied", "not_copyable"])
def test_check_leaves_weights_buffers_rng_modes_and_grad_flags_as_they_were(copyable):
    model = Attention()
    model.register_buffer("steps", torch.zeros(3))
    model.W_k.weight.requires_grad_(False)
    model.train()
    model.drop.eval()  # a mixed train/eval tree must come back mixed
    if not copyable:
        model.lock = threading.Lock()  # deepcopy fails: check works on the module itself
        with pytest.raises(TypeError):
            copy.deepcopy(model)
    before = _snapshot(model)
    torch.manual_seed(123)
    random.seed(123)
    expected_torch, expected_py = torch.rand(4), random.random()
    report = check(model, torch.randn(B, S, D), mask=causal())
    assert report.passed, report.render(width=140)
    _assert_untouched(model, before)
    x, mask = torch.randn(B, S, D), causal()
    torch.manual_seed(123)
    random.seed(123)
    check(model, x, mask=mask)  # draws random numbers inside, and restores the RNG
    # The next draws are the ones that would have come without the check.
    assert torch.equal(torch.rand(4), expected_torch)
    assert random.random() == expected_py


@pytest.mark.no_shapeguard
def test_check_restores_everything_when_the_module_fails():
    model = Attention("merge")
    model.train()
    before = _snapshot(model)
    x = torch.randn(B, S, 34)  # wrong width: the forward fails
    rng = torch.get_rng_state()
    report = check(model, x)
    assert not report.passed
    assert result(report, "shape checks").message.startswith("the forward fails:")
    _assert_untouched(model, before)
    assert torch.equal(torch.get_rng_state(), rng)


def test_guarded_modules_are_probed_without_their_guard():
    import shapeguard

    model = shapeguard.guard(Attention())
    report = check(model, torch.randn(B, S, D))
    assert report.passed
    assert shapeguard.is_guarded(model)
    assert shapeguard.is_enabled()


# -- the report ---------------------------------------------------------------------------
@pytest.mark.no_shapeguard  # warns on purpose
def test_report_renders_a_plain_table_and_each_failure_in_full():
    report = check(Attention("merge"), torch.randn(B, S, D))
    text = report.render(width=120)
    assert "\x1b[" not in text
    lines = text.splitlines()
    assert lines[0].startswith("shapeguard check: Attention")
    assert any(
        line.startswith("│ head-permutation invariance") and "failed" in line for line in lines
    )
    assert "head-permutation invariance: permuting the 3 heads of Attention" in text
    assert lines[-1] == "11 checks in float64: 4 passed, 3 failed, 4 n/a; failed"
    assert str(report) == report.render()
    assert report.to_dict()["passed"] is False


@pytest.mark.no_shapeguard  # warns on purpose
def test_report_as_json_carries_every_probe_with_its_reason_and_verdict():
    import json

    report = check(Attention("merge"), torch.randn(B, S, D))
    data = json.loads(report.to_json())
    assert data["schema"] == "shapeguard.check" and data["schema_version"] == 2
    assert data["verdict"] == "failed" and data["passed"] is False
    assert [r["name"] for r in data["results"]] == [r.name for r in report.results]
    assert data["counts"] == {
        status: sum(r.status == status for r in report.results)
        for status in ("passed", "failed", "inconclusive", "skipped")
    }
    failed = next(r for r in data["results"] if r["name"] == "head-permutation invariance")
    assert failed["status"] == "failed" and failed["deviation"] > failed["tolerance"]
    assert failed["hint"].startswith("heads are not kept apart")
    assert "merged by reshape at" in failed["op"]
    skipped = next(r for r in data["results"] if r["status"] == "skipped")
    assert skipped["reason"] == skipped["message"].splitlines()[0]
    assert skipped["applicable"] is False  # "skipped" is kept for n/a only
    assert data["summary"] == report.summary()


def test_the_summary_never_says_passed_when_no_probe_ran():
    class Constant(nn.Module):
        def forward(self, x):
            return x.sum() * 0  # no batch axis in the output: no probe applies

    report = check(Constant(), torch.randn(B, D))
    assert report.passed and report.verdict == "not probed"
    assert report.summary().endswith("no probe applied, so only the shape checks passed")
    assert report.to_dict()["verdict"] == "not probed"


def _line(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "_line(" not in line)
