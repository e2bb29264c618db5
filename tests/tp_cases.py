"""Tensor-parallel bugs for the rules of shapeguard/checks/tp.py, and their fixes, at the
three size settings of tests/bug_zoo.py; tests/test_rule_registry.py runs them.

Each case runs one rank of a tp-way run on torch's fake process group
(`shapeguard.distributed.fake_tp`). The setting's sizes are what that rank holds: its
query and kv heads (the module declares tp times as many), its d_k, and under sequence
parallelism its slice of seq, so the coincident setting coincides on the rank, where the
rules read. A case builds its module (`bug`: None for the fix) on the mesh, parallelized
by its plan, with its inputs; the line where a bug bites ends in `# <- name`.

    tp_too_wide        a tp degree past the kv heads (one query head per rank): each rank
                       would hold part of a kv head (torchtitan#932)
    plain_operand      DTensor queries combined with a plain tensor the plan left alone,
                       by a product (`matmul`) or elementwise (`mul`)
    replicated_as_shard  a row-parallel output made whole by its all_reduce, declared this
                       rank's slice of seq by a sequence-parallel norm or gate
    gather_other_axis  attention's input scattered along seq, declared and gathered along
                       batch by the next attention's plan
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from bug_zoo import Sizes
from torch import nn

TP = 2  # the degree of every fix: it divides the module's heads (tp x the setting's)


class Attention(nn.Module):
    """Llama's attention on local shards (wq, wk, wv column-parallel, wo row-parallel),
    viewed with -1 for the heads, as torchtitan does, so it runs at any tp."""

    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.wq = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, d_model, bias=False)

    def forward(self, x):
        B, S, _ = x.shape
        q = self.wq(x).view(B, S, -1, self.head_dim).transpose(1, 2)  # <- gather_other_axis
        k = self.wk(x).view(B, S, -1, self.head_dim).transpose(1, 2)  # <- tp_too_wide
        v = self.wv(x).view(B, S, -1, self.head_dim).transpose(1, 2)
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(context.transpose(1, 2).reshape(B, S, -1))


class Mixed(nn.Module):
    """Queries kept as DTensors (ColwiseParallel(use_local_output=False)), then a map over
    the head features, a buffer the plan leaves a plain tensor: a [d_k, d_k] product
    (`combine="matmul"`) or a [seq, 1, d_k] scale multiplied in ("mul", as rotary does)."""

    def __init__(self, d_model, n_heads, seq, combine, bug=None):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.combine, self.bug = combine, bug
        self.wq = nn.Linear(d_model, d_model, bias=False)
        shape = (self.head_dim,) * 2 if combine == "matmul" else (seq, 1, self.head_dim)
        self.register_buffer("mix", torch.randn(shape))

    def forward(self, x):
        from torch.distributed.tensor import DTensor, Replicate

        B, S, _ = x.shape
        q = self.wq(x).view(B, S, self.n_heads, self.head_dim)  # a DTensor: global sizes
        mix = self.mix
        if self.bug != "plain_operand":  # every rank holds it whole
            mix = DTensor.from_local(mix, q.device_mesh, [Replicate()])
        if self.combine == "matmul":
            return q @ mix  # <- plain_operand
        return q * mix  # <- plain_operand


class Gate(nn.Module):
    """A SiLU gate spelled out: an elementwise product of two tensors."""

    def forward(self, h):
        return h * torch.sigmoid(h)  # <- replicated_as_shard


class Sequenced(nn.Module):
    """A plain-TP MLP (up column-parallel, down row-parallel), then a sequence-parallel
    layer on its output: a norm (`then="norm"`, SequenceParallel) or a gate ("gate",
    PrepareModuleInput(input_layouts=Shard(1)))."""

    def __init__(self, d_model, then):
        super().__init__()
        self.up = nn.Linear(d_model, 4 * d_model)
        self.down = nn.Linear(4 * d_model, d_model)
        self.after = nn.LayerNorm(d_model) if then == "norm" else Gate()

    def forward(self, x):
        return self.after(self.down(self.up(x)))  # <- replicated_as_shard


class TwoAttention(nn.Module):
    """Two attentions in a row, under sequence parallelism: each gathers its input's seq
    and wo scatters it back."""

    def __init__(self, d_model, n_heads, n_kv_heads):
        super().__init__()
        self.first = Attention(d_model, n_heads, n_kv_heads)
        self.second = Attention(d_model, n_heads, n_kv_heads)

    def forward(self, x):
        return self.second(self.first(x))


# -- the plans and the cases ---------------------------------------------------------------
def _attention_plan(prefix=""):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {f"{prefix}w{p}": ColwiseParallel() for p in "qkv"}
    return plan | {f"{prefix}wo": RowwiseParallel()}


def _parallel(model, mesh, plan):
    from torch.distributed.tensor.parallel import parallelize_module

    return parallelize_module(model, mesh, plan)


def _x(s: Sizes, seq: int):
    return (torch.randn(s.batch, seq, TP * s.d_model),)


def too_wide(s: Sizes, bug, mesh):
    # The same module either way: the bug is the mesh's degree (`_one_q_head_per_rank`).
    model = Attention(TP * s.d_model, TP * s.heads, TP * s.kv_heads)
    return _parallel(model, mesh, _attention_plan()), _x(s, s.seq)


def mixed(combine):
    def make(s: Sizes, bug, mesh):
        from torch.distributed.tensor.parallel import ColwiseParallel

        model = Mixed(TP * s.d_model, TP * s.heads, s.seq, combine, bug)
        return _parallel(model, mesh, {"wq": ColwiseParallel(use_local_output=False)}), _x(s, s.seq)

    return make


def sequenced(then):
    def make(s: Sizes, bug, mesh):
        from torch.distributed.tensor import Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            PrepareModuleInput,
            RowwiseParallel,
            SequenceParallel,
        )

        # The fix scatters seq where down reduces; the bug keeps down's Replicate output.
        down = RowwiseParallel() if bug else RowwiseParallel(output_layouts=Shard(1))
        after = SequenceParallel() if then == "norm" else (
            PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),))
        )  # fmt: skip
        plan = {"up": ColwiseParallel(), "down": down, "after": after}
        # The whole sequence goes in: the fix leaves this rank s.seq of it.
        return _parallel(Sequenced(TP * s.d_model, then), mesh, plan), _x(s, TP * s.seq)

    return make


def two_attention(s: Sizes, bug, mesh):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, RowwiseParallel

    plan = {}
    # Both wo scatter seq (Shard(1)); the bug's second attention takes it for batch.
    for name, dim in (("first", 1), ("second", 0 if bug else 1)):
        plan[name] = PrepareModuleInput(
            input_layouts=(Shard(dim),), desired_input_layouts=(Replicate(),)
        )
        plan |= _attention_plan(f"{name}.")
        plan[f"{name}.wo"] = RowwiseParallel(output_layouts=Shard(1))
    model = TwoAttention(TP * s.d_model, TP * s.heads, TP * s.kv_heads)
    return _parallel(model, mesh, plan), _x(s, s.seq)  # this rank's slice of seq


@dataclass(frozen=True)
class TPCase:
    """One TP bug in one style: make(sizes, bug, mesh) builds the parallelized module
    (bug=None: the fix) and its inputs on a mesh of degree(sizes, bug); the finding has
    `kind`, a first line containing each of says(sizes), and a hint containing `fix`."""

    name: str
    style: str
    make: Callable
    kind: str
    says: Callable[[Sizes], tuple[str, ...]]
    fix: str
    degree: Callable[[Sizes, str | None], int] = lambda s, bug: TP

    def __str__(self) -> str:
        return f"{self.name}-{self.style}"


def _one_q_head_per_rank(s: Sizes, bug) -> int:
    return TP * s.heads if bug else TP


def _too_wide_says(s: Sizes) -> tuple[str, ...]:
    tp = TP * s.heads
    return (
        f"n_kv_heads={TP * s.kv_heads} is not divisible by tp={tp}: ",
        f"; wk is column-parallel (its weight is Shard(0) over mesh dim 'tp' of size {tp})",
    )


def _mixed_says(op):
    return lambda s: (
        f"{op}: mixes DTensor and plain tensors: q is a DTensor (Shard(2) on tp={TP}), "
        "mix is a plain torch.Tensor",
    )


def _replicated_says(op):
    def says(s: Sizes) -> tuple[str, ...]:
        local = [s.batch, TP * s.seq, TP * s.d_model]
        return (
            f"{op}: input is declared Shard(1) on tp={TP}, this rank's 1/{TP} of seq, but its "
            f"local tensor {local} is replicated: every rank holds the same {local[1]} rows, "
            f"made whole by down's all_reduce; as a DTensor its seq is {TP * local[1]} = "
            f"{local[1]} x tp={TP}, the same rows {TP} times",
        )

    return says


def _gathered_says(s: Sizes) -> tuple[str, ...]:
    local = [s.batch, s.seq, TP * s.d_model]
    return (
        f"linear: second reads {[TP * s.batch, *local[1:]]} (wq's input), second's all_gather "
        f"along dim 0 of a tensor declared Shard(0): its local {local} is this rank's {s.seq} "
        f"of seq's {TP * s.seq}, split by first.wo's reduce-scatter along seq (Partial -> "
        "Shard(1))",
    )


REPLICATE = "DTensor.from_local(mix, mesh, [Replicate()])"
SCATTER = "RowwiseParallel(output_layouts=Shard(1)) on down"
CASES = [
    TPCase("tp_too_wide", "kv_heads", too_wide, "tp_head_divisibility", _too_wide_says,
           "each kv head has to be replicated on tp // n_kv_heads", _one_q_head_per_rank),
    TPCase("plain_operand", "matmul", mixed("matmul"), "dtensor_mixed", _mixed_says("matmul"),
           REPLICATE),
    TPCase("plain_operand", "mul", mixed("mul"), "dtensor_mixed", _mixed_says("mul"), REPLICATE),
    TPCase("replicated_as_shard", "norm", sequenced("norm"), "tp_shard_replicated",
           _replicated_says("layer_norm"), SCATTER),
    TPCase("replicated_as_shard", "gate", sequenced("gate"), "tp_shard_replicated",
           _replicated_says("mul"), SCATTER),
    TPCase("gather_other_axis", "attention", two_attention, "tp_shard_axis_mismatch",
           _gathered_says, "to match RowwiseParallel(output_layouts=Shard(1)) on first.wo"),
]  # fmt: skip
