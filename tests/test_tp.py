"""Tensor parallelism on torch's fake process group: one rank of a tp-way run, in this
process, with no communication (`shapeguard.distributed.fake_tp`). Fast, and what rank 0
of a real run sees: the sharding is read from the DTensor weights, never by a collective.

Sizes are pairwise distinct on the local shard (tests/tp_models.py).
"""

import json
import re

import pytest
import torch
from tp_models import DIM, HD, KV, LLAMA3_8B, Attention, B, H, S, example_input, parallel

import shapeguard
from shapeguard import ShapeError, ShapeWarning
from shapeguard.distributed import fake_tp

pytest.importorskip("torch.distributed.tensor")


def _error(model, x) -> ShapeError:
    with pytest.raises(ShapeError) as info:
        shapeguard.trace(model, x)
    return info.value


# -- tp_head_divisibility --------------------------------------------------------------------
@pytest.mark.no_shapeguard
def test_llama3_8b_at_tp16_on_meta_reproduces_torchtitan_932_and_names_tp():
    """torchtitan#932 ran seq 64, where wk's local 64 features equal seq; here seq is 48,
    so every size differs (batch 2, seq 48, 2 local heads of 128, 256 local q features)."""
    x = torch.empty(2, 48, LLAMA3_8B["dim"], device="meta")
    with fake_tp(16) as mesh:
        with torch.device("meta"):
            bare = parallel(mesh, Attention(**LLAMA3_8B))
        # torchtitan#932: torch's own error, at the kv head split, says nothing of tp.
        with pytest.raises(RuntimeError, match=re.escape("shape '[2, 48, -1, 128]' is invalid")):
            bare(x)
        error = _error(bare, x)
    assert error.kind == "tp_head_divisibility"
    first = str(error).splitlines()[0]
    assert first == (
        "n_kv_heads=8 is not divisible by tp=16: each rank would hold half a kv head "
        "(64 of wk's 1024 output features, head_dim 128); wk is column-parallel "
        "(its weight is Shard(0) over mesh dim 'tp' of size 16)"
    )
    assert error.hint.startswith("tp degrees that work for n_heads=32, n_kv_heads=8: 1, 2, 4, 8;")
    assert "replicated on tp // n_kv_heads = 2 ranks" in error.hint
    assert "in  wk (Linear) at tests/tp_models.py:" in str(error)


def test_llama3_8b_at_tp8_on_meta_passes():
    """At tp=8 each rank holds one kv head: its 128 features are head_dim, by the model."""
    with fake_tp(8) as mesh:
        with torch.device("meta"):
            model = parallel(mesh, Attention(**LLAMA3_8B))
        trace = shapeguard.trace(model, torch.empty(2, 48, LLAMA3_8B["dim"], device="meta"))
    assert trace.findings == []
    info = trace.to_dict()["distributed"]
    assert (info["rank"], info["world_size"], info["simulated"]) == (0, 8, True)
    module = info["modules"]["Attention"]
    assert module["heads"] == {"attribute": "n_heads", "declared": 32, "global": 32, "local": 4}
    assert module["kv_heads"]["local"] == 1
    assert "heads=4 (32/tp8)" in trace.table(width=220)


@pytest.mark.no_shapeguard
def test_an_uneven_kv_split_names_the_rank_shares_and_the_degrees_that_work():
    with fake_tp(2) as mesh:
        model = parallel(mesh, Attention(n_kv_heads=3))  # wk: 48 features, 3 heads of 16
        error = _error(model, example_input(batch=7))  # batch 3 would be the kv count
    assert error.kind == "tp_head_divisibility"
    assert str(error).startswith("n_kv_heads=3 is not divisible by tp=2: each rank would hold ")
    assert "24 of wk's 48 output features, head_dim 16" in str(error)
    assert error.hint.startswith("tp degrees that work for n_heads=12, n_kv_heads=3: 1, 3")


@pytest.mark.no_shapeguard
def test_fewer_kv_heads_than_ranks_hints_kv_replication():
    with fake_tp(4) as mesh:
        model = parallel(mesh, Attention(n_kv_heads=2))  # 12 q heads split 4 ways: 3 each
        error = _error(model, example_input(batch=7))  # batch 3 would be the local count
    assert error.kind == "tp_head_divisibility"
    assert str(error).startswith("n_kv_heads=2 is not divisible by tp=4: each rank would hold")
    assert error.hint.startswith("tp degrees that work for n_heads=12, n_kv_heads=2: 1, 2;")
    assert "each kv head has to be replicated on tp // n_kv_heads = 2 ranks" in error.hint


# -- tp_global_heads / tp_local_heads --------------------------------------------------------
@pytest.mark.no_shapeguard
def test_the_global_head_count_on_a_local_shard():
    with fake_tp(2) as mesh:
        model = parallel(mesh, Attention(local="none"))
        error = _error(model, example_input())
    assert error.kind == "tp_global_heads"
    lines = str(error).splitlines()
    assert lines[0] == (
        f"wq(x).view({B}, {S}, 12, {HD}): n_heads=12 is the global head count, but wq(x) is "
        "this rank's shard of wq: 96 = 192 / tp=2 features (wq is column-parallel), 6 heads of 16"
    )
    assert f"  wq(x)  [batch={B}, seq={S}, 96] float32" in lines
    assert error.hint == (
        f"use the local head count, n_heads // tp = 6: wq(x).view({B}, {S}, 6, {HD}); or -1 as "
        f"torchtitan does (wq(x).view({B}, {S}, -1, {HD})), which works at any tp; or keep "
        "DTensor activations (ColwiseParallel(use_local_output=False)) and global sizes"
    )


@pytest.mark.no_shapeguard
def test_the_t5_spelling_of_the_global_count_on_a_local_shard():
    """view(bs, -1, n_heads, d) of a local shard: the -1 takes tp's factor. At an odd seq
    it cannot (an error; the hint's -1 for the heads keeps seq, never two -1s)..."""
    with fake_tp(2) as mesh:
        model = parallel(mesh, Attention(local="none", spelling="t5"))
        error = _error(model, example_input())
    assert error.kind == "tp_global_heads"
    assert f"wq(x).view({B}, -1, 6, {HD}); or -1 as torchtitan does " in error.hint
    assert f"(wq(x).view({B}, {S}, -1, {HD}))" in error.hint


@pytest.mark.no_shapeguard
def test_the_t5_spelling_that_runs_folds_tp_into_seq_and_the_hint_says_so():
    """... at an even seq it runs, with seq doubled and half the heads' features: the
    view rule's finding, its hint naming tp."""
    seq = 8
    with fake_tp(2) as mesh:
        model = parallel(mesh, Attention(local="none", spelling="t5"))
        # The kv views then fail (the global n_kv_heads on wk's shard): warn mode goes on
        # past the warning to that error.
        with pytest.warns(ShapeWarning) as caught, pytest.raises(ShapeError) as error:
            shapeguard.trace(model, example_input(seq=seq), mode="warn")
    assert error.value.kind == "tp_global_heads"
    warning = next(w.message for w in caught if isinstance(w.message, ShapeWarning))
    assert warning.kind == "view_mixes_axes"
    assert str(warning).startswith(f"wq(x).view({B}, -1, 12, {HD}): carves heads out of the seq")
    hint = warning.hint
    assert "is this rank's shard of wq: 96 = 192 / tp=2 features, so the -1 absorbed tp=2" in hint
    assert "use the local head count n_heads // tp = 6, or -1 for the heads" in hint


@pytest.mark.no_shapeguard
def test_the_local_head_count_on_a_dtensor():
    with fake_tp(2) as mesh:
        model = Attention(n_kv_heads=H, tp=2, local="tp", manual=True)  # n_heads // tp
        model = parallel(mesh, model, local_output=False)
        error = _error(model, example_input())
    assert error.kind == "tp_local_heads"
    lines = str(error).splitlines()
    assert lines[0] == (
        f"wq(x).view({B}, {S}, 6, {HD}): wq(x) is a DTensor (Shard(2) on tp=2), and a view of "
        "a DTensor takes global sizes, but 6 is the local head count (n_heads=12 / tp=2)"
    )
    assert f"  wq(x)  [batch={B}, seq={S}, 192] float32, DTensor Shard(2) on tp=2, local " in (
        "\n".join(lines)
    )
    assert error.hint == (
        f"view the DTensor with global sizes, wq(x).view({B}, {S}, 12, {HD}) or "
        f"wq(x).view({B}, {S}, -1, {HD}) (n_heads=12 is already the count a DTensor view "
        "takes); or ask for local shards (ColwiseParallel(use_local_output=True)) and keep "
        "the local count"
    )


# -- dtensor_mixed ---------------------------------------------------------------------------
class _Rope(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.n_heads, self.head_dim = 12, HD
        self.wq = torch.nn.Linear(DIM, DIM, bias=False)

    def forward(self, x):
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, self.n_heads, self.head_dim)
        rope = torch.ones(seqlen, 1, self.head_dim)
        return xq * rope


@pytest.mark.no_shapeguard
def test_a_dtensor_mixed_with_a_plain_tensor_names_which_is_which():
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    with fake_tp(2) as mesh:
        model = parallelize_module(_Rope(), mesh, {"wq": ColwiseParallel(use_local_output=False)})
        error = _error(model, example_input())
    assert error.kind == "dtensor_mixed"
    assert str(error).splitlines()[0] == (
        "mul: mixes DTensor and plain tensors: xq is a DTensor (Shard(2) on tp=2), "
        "rope is a plain torch.Tensor"
    )
    assert f"  rope   [{S}, 1, {HD}] float32" in str(error)
    assert "DTensor.from_local(rope, mesh, [Replicate()])" in error.hint


@pytest.mark.no_shapeguard
def test_a_process_group_set_up_inside_an_open_trace_brings_the_tp_rules_at_once():
    # Without a process group no DTensor can exist and no collective can run, so the
    # rules of tensor parallelism are not asked; a trace opened before the mesh is made
    # (a test that sets up its mesh in its body) must still check the ops after it.
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from shapeguard import checks

    single = {r.family for r in checks.rules_for("mul", distributed=False)}
    assert "tp" in {r.family for r in checks.rules_for("mul")} and "tp" not in single
    model = _Rope()
    with pytest.raises(ShapeError) as info, shapeguard.trace():
        model(example_input())  # before any process group: nothing to say
        assert not checks.distributed_now()
        with fake_tp(2) as mesh:
            assert checks.distributed_now()
            plan = {"wq": ColwiseParallel(use_local_output=False)}
            parallelize_module(model, mesh, plan)(example_input())
    assert info.value.kind == "dtensor_mixed"
    assert str(info.value).startswith("mul: mixes DTensor and plain tensors: xq is a DTensor")


# -- correct models: no finding, local axes named, sharding shown ----------------------------
@pytest.mark.parametrize(
    ("local", "local_output"), [("tp", True), ("infer", True), ("none", False), ("infer", False)]
)
def test_correct_tp_attention_has_no_finding(local, local_output):
    kv, manual = (KV, False) if local_output else (H, True)  # DTensor activations: no SDPA
    with fake_tp(2) as mesh:
        model = Attention(n_kv_heads=kv, tp=2, local=local, manual=manual)
        model = parallel(mesh, model, local_output=local_output)
        trace = shapeguard.trace(model, example_input())
    assert trace.findings == [], [f.message for f in trace.findings]


def test_local_head_axes_are_named_with_their_global_count_and_shards_show_placement():
    with fake_tp(2) as mesh:
        model = parallel(mesh, Attention(tp=2, local="tp"))
        trace = shapeguard.trace(model, example_input())
    table = trace.table(width=220)
    assert f"[batch={B}, heads=6 (12/tp2), seq={S}, d_k={HD}]" in table
    assert f"kv_heads={KV // 2} ({KV}/tp2)" in table
    assert f"[batch={B}, seq={S}, 192] Shard(2) on tp=2, local [{B}, {S}, 96]" in table
    data = json.loads(trace.to_json())
    first = data["events"][0]
    assert first["op"] == "linear"
    (out,) = first["outputs"]
    assert out["placements"] == ["Shard(2)"] and out["mesh"] == {"tp": 2}
    assert out["shape"] == [B, S, DIM] and out["local_shape"] == [B, S, DIM // 2]
    assert out["bytes"] == B * S * (DIM // 2) * 4  # what this rank holds
    assert data["distributed"]["modules"]["Attention"]["projections"]["wk"] == {
        "style": "column",
        "global": [KV * HD, DIM],
        "local": KV * HD // 2,
    }


def test_torch_distributed_plumbing_is_neither_checked_nor_shown():
    """from_local/redistribute/the row-parallel reduction run ops inside torch.distributed:
    every event is the user's code."""
    with fake_tp(2) as mesh:
        model = parallel(mesh, Attention(tp=2, local="tp"))
        trace = shapeguard.trace(model, example_input())
    assert trace.events
    where = {e.location.split(":")[0] for e in trace.events}
    assert where <= {"tests/tp_models.py", "tests/test_tp.py"}, where
    assert "all_reduce" not in {e.op for e in trace.events}


@pytest.mark.no_shapeguard
def test_dtensor_sdpa_on_cpu_keeps_torch_not_implemented_error():
    """DTensor has no sharding strategy for SDPA's CPU kernel: torch's NotImplementedError,
    which fallbacks catch, not a ShapeError."""
    with fake_tp(2) as mesh:
        model = parallel(mesh, Attention(n_kv_heads=H, tp=2, local="none"), local_output=False)
        with pytest.raises(NotImplementedError, match="sharding strategy") as info:
            shapeguard.trace(model, example_input())
    assert not isinstance(info.value, ShapeError)


def test_torch_own_not_implemented_error_is_kept_for_except_clauses():
    class Upsample(torch.nn.Module):
        def forward(self, x):
            try:
                return torch.nn.functional.interpolate(x, scale_factor=2, mode="bicubic")
            except NotImplementedError:  # 3-D input: bicubic needs 4-D; fall back
                return torch.nn.functional.interpolate(x, scale_factor=2, mode="linear")

    trace = shapeguard.trace(Upsample(), torch.randn(B, S, HD))
    assert trace.findings == []


def test_check_passes_a_correct_tp_model():
    from shapeguard._probes.check import check

    with fake_tp(2) as mesh:
        model = parallel(mesh, Attention(tp=2, local="tp"))
        report = check(model, example_input())
    assert report.passed, report.render(width=160)


def test_fake_tp_refuses_bad_degrees_and_ranks():
    from shapeguard import ContractError

    with pytest.raises(ContractError, match="tp must be a positive int"), fake_tp(0):
        pass
    with pytest.raises(ContractError, match=r"rank must be in 0\.\.1"), fake_tp(2, rank=2):
        pass


# -- FSDP ------------------------------------------------------------------------------------
@pytest.fixture
def dp2_tp2_mesh():
    """A 2-D mesh (dp=2, tp=2) on torch's fake process group of 4 ranks, rank 0."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from shapeguard.distributed import register_fake_backend

    register_fake_backend()
    dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=4)
    try:
        yield init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    finally:
        dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore:FSDP2-wrapped module:UserWarning")
def test_fsdp2_and_fsdp2_with_tp_have_no_finding_and_show_only_user_code(dp2_tp2_mesh):
    fully_shard = pytest.importorskip("torch.distributed.fsdp").fully_shard
    both = parallel(dp2_tp2_mesh["tp"], Attention(tp=2, local="tp"))
    fully_shard(both, mesh=dp2_tp2_mesh["dp"])
    trace = shapeguard.trace(both, example_input())
    assert trace.findings == []
    assert "heads=6 (12/tp2)" in trace.table(width=220)
    assert {e.location.split(":")[0] for e in trace.events} == {"tests/tp_models.py"}
    alone = Attention()
    fully_shard(alone, mesh=dp2_tp2_mesh["dp"])  # dp's Shard(0) is not tensor parallelism
    trace = shapeguard.trace(alone, example_input())
    assert trace.findings == []
    assert "tp" not in json.dumps(trace.to_dict()["distributed"].get("modules", {}))


# -- tp_shard_replicated: a replicated tensor declared this rank's shard (sequence parallel) ----
class _MlpNorm(torch.nn.Module):
    """A plain-TP MLP (up colwise, down rowwise) then a norm: under SequenceParallel on the
    norm, down's default Replicate output is declared this rank's slice of seq."""

    def __init__(self, rms=False):
        super().__init__()
        self.up = torch.nn.Linear(DIM, 4 * DIM)
        self.down = torch.nn.Linear(4 * DIM, DIM)
        self.norm = torch.nn.RMSNorm(DIM) if rms else torch.nn.LayerNorm(DIM)

    def forward(self, x):
        h = self.down(self.up(x))
        return self.norm(h)


class _SpBlock(torch.nn.Module):
    """torchtitan's sequence-parallel block: norm (SequenceParallel), attention gathering
    seq (PrepareModuleInput Shard(1) -> Replicate), wo scattering it back (Shard(1))."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.attn = Attention(tp=2, local="tp")

    def forward(self, x):
        return x + self.attn(self.norm(x))


def _sp_plan(wo_output=None, attn_input=None):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    layouts = attn_input or (Shard(1),)
    return {
        "norm": SequenceParallel(),
        "attn": PrepareModuleInput(input_layouts=layouts, desired_input_layouts=(Replicate(),)),
        "attn.wq": ColwiseParallel(),
        "attn.wk": ColwiseParallel(),
        "attn.wv": ColwiseParallel(),
        "attn.wo": RowwiseParallel(output_layouts=wo_output or Shard(1)),
    }


def _mlp_plan(**norm):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    return {"up": ColwiseParallel(), "down": RowwiseParallel(), "norm": SequenceParallel(**norm)}


@pytest.mark.no_shapeguard
@pytest.mark.parametrize("rms", [False, True])
def test_sequence_parallel_given_a_replicated_tensor_warns(rms):
    """pytorch#129355: SequenceParallel takes a plain tensor for this rank's slice of
    seq; down's all_reduce made it whole on every rank, so the DTensor's seq is 2 x 5
    with the rows repeated. Local sizes: batch 3, seq 5, 192 and 384 features."""
    from torch.distributed.tensor.parallel import parallelize_module

    with fake_tp(2) as mesh:
        model = parallelize_module(_MlpNorm(rms), mesh, _mlp_plan())
        with pytest.warns(ShapeWarning) as caught:
            trace = shapeguard.trace(model, example_input(), mode="warn")
    (finding,) = [f for f in trace.findings if f.kind == "tp_shard_replicated"]
    assert [f.kind for f in trace.findings] == ["tp_shard_replicated"]
    op = "rms_norm" if rms else "layer_norm"
    lines = finding.message.splitlines()
    assert lines[0] == (
        f"{op}: input is declared Shard(1) on tp=2, this rank's 1/2 of seq, but its local "
        f"tensor [{B}, {S}, {DIM}] is replicated: every rank holds the same {S} rows, made "
        f"whole by down's all_reduce; as a DTensor its seq is {2 * S} = {S} x tp=2, the same "
        "rows 2 times"
    )
    assert lines[1].startswith("  in  norm (") and "tests/test_tp.py:" in lines[1]
    assert lines[2].strip() == "return self.norm(h)"
    assert f"DTensor Shard(1) on tp=2, local [{B}, {S}, {DIM}]" in finding.message
    warning = next(w.message for w in caught if isinstance(w.message, ShapeWarning))
    assert warning.kind == "tp_shard_replicated"
    assert warning.hint == (
        "keep the sequence sharded upstream: RowwiseParallel(output_layouts=Shard(1)) on "
        "down, as torchtitan's sequence-parallel plan does; or hand norm "
        f"({'RMSNorm' if rms else 'LayerNorm'}) a DTensor, RowwiseParallel(use_local_output="
        "False) on down, which SequenceParallel cuts to Shard(1) with no communication"
    )


@pytest.mark.no_shapeguard
def test_a_replicated_tensor_declared_shard1_and_gathered_warns_at_the_gather():
    """PrepareModuleInput(input_layouts=Shard(1), desired Replicate) on wo's default
    Replicate output: the all_gather stacks the 2 equal copies, seq 5 becomes 10."""
    from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

    class TwoAttn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first = Attention(tp=2, local="tp")
            self.attn = Attention(tp=2, local="tp")

        def forward(self, x):
            return self.attn(self.first(x))

    from torch.distributed.tensor.parallel import ColwiseParallel

    plan = {f"first.{p}": ColwiseParallel() for p in ("wq", "wk", "wv")}
    plan["first.wo"] = RowwiseParallel()  # plain TP: a Replicate output
    plan.update({k: v for k, v in _sp_plan().items() if k.startswith("attn")})
    with fake_tp(2) as mesh:
        model = parallelize_module(TwoAttn(), mesh, plan)
        with pytest.warns(ShapeWarning):
            trace = shapeguard.trace(model, example_input(), mode="warn")
    found = [f for f in trace.findings if f.kind == "tp_shard_replicated"]
    assert found and {f.kind for f in trace.findings} == {"tp_shard_replicated"}
    first = found[0].message.splitlines()
    assert first[0] == (
        f"linear: input [{B}, {2 * S}, {DIM}] is attn's all_gather_into_tensor of a tensor "
        f"every rank already held whole ([{B}, {S}, {DIM}], made whole by first.wo's "
        f"all_reduce), declared this rank's shard on the way: its seq is {2 * S} = {S} x 2 "
        "ranks, the same rows stacked once per rank"
    )
    assert first[1].startswith("  in  attn.wq (Linear) at tests/tp_models.py:")
    assert found[0].hint == (
        "declare what attn is given: PrepareModuleInput(input_layouts=Replicate(), "
        "desired_input_layouts=Replicate()) (nothing to gather); keep the sequence sharded "
        "upstream: RowwiseParallel(output_layouts=Shard(1)) on first.wo, as torchtitan's "
        "sequence-parallel plan does"
    )


def test_correct_sequence_parallel_is_silent_and_names_the_global_seq():
    """torchtitan's plan: the caller's input is this rank's slice of seq (5 of 10), the
    norm is SequenceParallel, attention gathers seq and wo scatters it back."""
    from torch.distributed.tensor.parallel import parallelize_module

    with fake_tp(2) as mesh:
        model = parallelize_module(_SpBlock(), mesh, _sp_plan())
        trace = shapeguard.trace(model, example_input())
    assert trace.findings == [], [f.message for f in trace.findings]
    table = trace.table(width=240)
    # The residual add is this rank's slice: seq named with the global length.
    assert f"[batch={B}, seq={S} ({2 * S}/tp2), {DIM}]" in table
    assert f"[{B}, seq={2 * S}, heads=6 (12/tp2), d_k={HD}]" in table  # gathered in attn


@pytest.mark.parametrize("keep_dtensor", [True, False])
def test_the_hinted_fixes_are_silent(keep_dtensor):
    """Both fixes the hint gives: down's output kept a DTensor (SequenceParallel cuts the
    Replicate DTensor itself), or scattered along seq (Shard(1))."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

    plan = _mlp_plan()
    plan["down"] = (
        RowwiseParallel(use_local_output=False)
        if keep_dtensor
        else RowwiseParallel(output_layouts=Shard(1))
    )
    with fake_tp(2) as mesh:
        model = parallelize_module(_MlpNorm(), mesh, plan)
        trace = shapeguard.trace(model, example_input())
    assert trace.findings == [], [f.message for f in trace.findings]


@pytest.mark.parametrize("rms", [False, True])
def test_sequence_parallel_on_the_callers_shard_is_silent(rms):
    """SequenceParallel's contract: a plain input is already this rank's slice. Nothing
    records a placement for what the caller passes, so it is never called replicated."""
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

    norm = torch.nn.RMSNorm(DIM) if rms else torch.nn.LayerNorm(DIM)
    with fake_tp(2) as mesh:
        model = parallelize_module(norm, mesh, SequenceParallel())
        trace = shapeguard.trace(model, example_input())
    assert trace.findings == []


def test_replicated_inputs_declared_replicate_are_silent():
    """Plain TP twice in a row: wo's Replicate output declared Replicate by the next
    attention (PrepareModuleInput(Replicate -> Replicate)), and a SequenceParallel norm
    fed by a DTensor (it redistributes what it is given)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import parallelize_module

    plan = _sp_plan(wo_output=Replicate(), attn_input=(Replicate(),))
    del plan["norm"]
    with fake_tp(2) as mesh:
        model = parallelize_module(_SpBlock(), mesh, plan)
        trace = shapeguard.trace(model, example_input())
    assert trace.findings == [], [f.message for f in trace.findings]


# -- tp_shard_axis_mismatch: a shard declared along another axis than it was split along -------
class _Mlp(torch.nn.Module):
    def __init__(self, dim=DIM):
        super().__init__()
        self.w1 = torch.nn.Linear(dim, 4 * dim)
        self.w2 = torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.w2(torch.relu(self.w1(x)))


class _Layer(torch.nn.Module):
    """torchtitan's transformer block: two sublayers, each norm -> module -> residual add.
    `seq_first`: Megatron's [seq, batch, dim] layout instead of [batch, seq, dim]; `dim`
    and `heads` its width and head count (GQA at the tests' sizes: KV kv heads)."""

    def __init__(self, seq_first=False, dim=DIM, heads=H):
        super().__init__()
        self.attention_norm = torch.nn.LayerNorm(dim)
        kv = KV if heads == H else heads
        self.attention = Attention(dim, heads, kv, tp=2, local="tp", seq_first=seq_first)
        self.ffn_norm = torch.nn.LayerNorm(dim)
        self.feed_forward = _Mlp(dim)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def _layer_plan(shard=1, *, ffn_shard=None, ffn_norm=True, sequence_parallel=True):
    """torchtitan's sequence-parallel plan with every shard along dim `shard`; the
    feed-forward sublayer's along `ffn_shard` (the same by default), its norm left out
    of the plan when `ffn_norm` is False (then it runs on the local tensor)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    col = {f"attention.{p}": ColwiseParallel() for p in ("wq", "wk", "wv")}
    if not sequence_parallel:  # plain TP: every activation whole on every rank
        return {**col, "attention.wo": RowwiseParallel(), "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel()}  # fmt: skip

    def gather(dim):
        return PrepareModuleInput(input_layouts=(Shard(dim),), desired_input_layouts=(Replicate(),))

    ffn = shard if ffn_shard is None else ffn_shard
    plan = {
        "attention_norm": SequenceParallel(sequence_dim=shard),
        "attention": gather(shard),
        **col,
        "attention.wo": RowwiseParallel(output_layouts=Shard(shard)),
        "ffn_norm": SequenceParallel(sequence_dim=ffn),
        "feed_forward": gather(ffn),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(ffn)),
    }
    if not ffn_norm:
        del plan["ffn_norm"]
    return plan


class _AttentionSublayer(torch.nn.Module):
    def __init__(self, dim=DIM, heads=H):
        super().__init__()
        self.attention_norm = torch.nn.LayerNorm(dim)
        self.attention = Attention(dim, heads, KV if heads == H else heads, tp=2, local="tp")

    def forward(self, x):
        return x + self.attention(self.attention_norm(x))


class _Layers(torch.nn.Module):
    """A first layer (a block, its attention sublayer, or an MLP, before which nothing
    names seq), then a block."""

    def __init__(self, first="block", seq_first=False, dim=DIM, heads=H):
        super().__init__()
        if first == "block":
            made = _Layer(seq_first, dim, heads)
        elif first == "attention":
            made = _AttentionSublayer(dim, heads)
        else:
            made = _Mlp(dim)
        self.layers = torch.nn.ModuleList([made, _Layer(seq_first, dim, heads)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _layers_plan(first, second) -> dict:
    return {
        **{f"layers.0.{k}": v for k, v in first.items()},
        **{f"layers.1.{k}": v for k, v in second.items()},
    }


def _layer_trace(plan, x, seq_first=False, model=None):
    from torch.distributed.tensor.parallel import parallelize_module

    with fake_tp(2) as mesh:
        model = parallelize_module(model or _Layer(seq_first), mesh, plan)
        return shapeguard.trace(model, x, mode="warn")


def _mismatches(trace):
    found = [f for f in trace.findings if f.kind == "tp_shard_axis_mismatch"]
    assert found and {f.kind for f in trace.findings} == {"tp_shard_axis_mismatch"}, [
        f.message for f in trace.findings
    ]
    return found


@pytest.mark.no_shapeguard
@pytest.mark.parametrize("batch", [B, S], ids=["distinct", "batch-equals-local-seq"])
@pytest.mark.parametrize("norm", [True, False], ids=["sequence-parallel-norm", "gather"])
def test_attention_given_a_seq_scatter_gathered_along_batch_warns(norm, batch):
    """Layer 0 (an attention sublayer) shards seq (Shard(1), torchtitan's plan), the block
    after it batch (Shard(0)): wo's scatter along seq reaches the block, whose plan takes
    it for this rank's slice of batch (its SequenceParallel(sequence_dim=0) norm, or with
    the norm unplanned its PrepareModuleInput(input_layouts=Shard(0))), and the gather
    before attention stacks the ranks' seq halves as batch items: attention mixes 5-token
    halves as sequences. Local sizes: batch 3 (or 5, the local seq), seq 5 of 10, 192."""
    first = {k: v for k, v in _layer_plan(1).items() if k.startswith("attention")}
    second = _layer_plan(0)
    if not norm:
        del second["attention_norm"]
    plan = _layers_plan(first, second)
    with pytest.warns(ShapeWarning) as caught:
        trace = _layer_trace(plan, example_input(batch=batch), model=_Layers("attention"))
    (finding,) = _mismatches(trace)
    lines = finding.message.splitlines()
    # seq is named: layer 0's attention made it a token axis. The batch axis has only a
    # convention for a name there, so it is called by its position.
    assert lines[0] == (
        f"linear: layers.1.attention reads [{2 * batch}, {S}, {DIM}] (wq's input), "
        "layers.1.attention's all_gather along dim 0 of a tensor declared Shard(0): its local "
        f"[{batch}, {S}, {DIM}] is this rank's {S} of seq's {2 * S}, split by "
        "layers.0.attention.wo's reduce-scatter along seq (Partial -> Shard(1)), so the gather "
        "stacked the ranks' slices of seq as dim 0 entries (dim 0 is "
        f"{2 * batch} = {batch} x 2 ranks, seq is {S}) and the sequences attention mixes "
        "tokens within are not the model's"
    )
    assert lines[1].startswith("  in  layers.1.attention.wq (Linear) at tests/tp_models.py:")
    taken = "layers.1.attention_norm" if norm else "layers.1.attention"
    assert finding.hint == (
        f"declare Shard(1) where {taken} takes it (SequenceParallel(sequence_dim=1), or "
        "input_layouts=Shard(1)), to match RowwiseParallel(output_layouts=Shard(1)) on "
        "layers.0.attention.wo; or shard dim 0 throughout: RowwiseParallel(output_layouts="
        "Shard(0)) on layers.0.attention.wo and every other producer of this tensor, Shard(0) "
        "wherever the plan takes it"
    )
    warning = next(w.message for w in caught if isinstance(w.message, ShapeWarning))
    assert warning.kind == "tp_shard_axis_mismatch"


@pytest.mark.no_shapeguard
def test_before_any_attention_the_axes_are_called_by_position():
    """An MLP scatters dim 1 of [3, 10, 192] before attention has named seq; the block
    after it declares dim 0 throughout."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    mlp = {"w1": ColwiseParallel(), "w2": RowwiseParallel(output_layouts=Shard(1))}
    plan = _layers_plan(mlp, _layer_plan(0))
    with pytest.warns(ShapeWarning):
        trace = _layer_trace(plan, example_input(seq=2 * S), model=_Layers("mlp"))
    (finding,) = _mismatches(trace)
    assert finding.message.splitlines()[0] == (
        f"linear: layers.1.attention reads [{2 * B}, {S}, {DIM}] (wq's input), "
        "layers.1.attention's all_gather along dim 0 of a tensor declared Shard(0): its local "
        f"[{B}, {S}, {DIM}] is this rank's {S} of dim 1's {2 * S}, split by layers.0.w2's "
        "reduce-scatter along dim 1 (Partial -> Shard(1)), so the gather stacked the ranks' "
        f"slices of dim 1 as dim 0 entries (dim 0 is {2 * B} = {B} x 2 ranks, dim 1 is {S}) "
        "and the sequences attention mixes tokens within are not the model's"
    )
    assert finding.hint.startswith("declare Shard(1) where layers.1.attention_norm takes it")


@pytest.mark.no_shapeguard
def test_a_whole_block_between_keeps_the_split_through_both_residual_adds():
    """Block 0 all Shard(1), block 1 all Shard(0): block 0's w2 scattered dim 1 (its FFN
    read a gathered copy, so nothing there names seq), both residual adds keep it."""
    plan = _layers_plan(_layer_plan(1), _layer_plan(0))
    with pytest.warns(ShapeWarning):
        trace = _layer_trace(plan, example_input(), model=_Layers())
    (finding,) = _mismatches(trace)
    assert finding.message.startswith(
        f"linear: layers.1.attention reads [{2 * B}, {S}, {DIM}] (wq's input), "
        "layers.1.attention's all_gather along dim 0 of a tensor declared Shard(0): its local "
        f"[{B}, {S}, {DIM}] is this rank's {S} of dim 1's {2 * S}, split by "
        "layers.0.feed_forward.w2's reduce-scatter along dim 1 (Partial -> Shard(1))"
    )


@pytest.mark.no_shapeguard
def test_seq_first_blocks_scattering_seq_then_declaring_batch_warn():
    """Megatron's [seq, batch, d]: block 0 shards seq (Shard(0)), block 1 declares batch
    (Shard(1)), so its gather stacks the ranks' seq slices along batch. Attention reads a
    transpose of the gather; the message is in the gather's layout, the plan's."""
    plan = _layers_plan(_layer_plan(0), _layer_plan(1))
    x = example_input().transpose(0, 1).contiguous()  # [5 of 10 seq, 3 batch, 192]
    with pytest.warns(ShapeWarning):
        trace = _layer_trace(plan, x, model=_Layers(seq_first=True))
    (finding,) = _mismatches(trace)
    assert finding.message.splitlines()[0] == (
        f"linear: layers.1.attention reads [{2 * B}, {S}, {DIM}] (wq's input), a transpose "
        f"of layers.1.attention's all_gather [{S}, {2 * B}, {DIM}] along dim 1 of a tensor "
        f"declared Shard(1): its local [{S}, {B}, {DIM}] is this rank's {S} of dim 0's "
        f"{2 * S}, split by layers.0.feed_forward.w2's reduce-scatter along dim 0 (Partial -> "
        f"Shard(0)), so the gather stacked the ranks' slices of dim 0 as dim 1 entries (dim 1 "
        f"is {2 * B} = {B} x 2 ranks, dim 0 is {S}) and the sequences attention mixes tokens "
        "within are not the model's"
    )
    assert finding.hint.startswith(
        "declare Shard(0) where layers.1.attention_norm takes it (SequenceParallel("
        "sequence_dim=0), or input_layouts=Shard(0)), to match RowwiseParallel(output_layouts="
        "Shard(0)) on layers.0.feed_forward.w2; or shard dim 1 throughout"
    )


@pytest.mark.parametrize("batch", [B, S], ids=["distinct", "batch-equals-local-seq"])
@pytest.mark.parametrize("norm", [True, False], ids=["sequence-parallel-norm", "gather"])
def test_a_position_wise_sublayer_given_the_same_mismatch_is_silent(norm, batch):
    """The feed-forward sublayer declares batch (Shard(0)) what attention's wo scattered
    along seq: the norm and the MLP treat every token alike and w2 scatters each back to
    the rank and place it came from, so the values are right (checked on gloo ranks
    below): no finding."""
    plan = _layer_plan(ffn_shard=0)
    if not norm:
        del plan["ffn_norm"]
    trace = _layer_trace(plan, example_input(batch=batch))
    assert trace.findings == [], [f.message for f in trace.findings]


@pytest.mark.parametrize("batch", [B, S], ids=["distinct", "batch-equals-local-seq"])
@pytest.mark.parametrize("shard", [0, 1])
@pytest.mark.parametrize("seq_first", [False, True], ids=["bsd", "sbd"])
def test_a_plan_that_shards_one_axis_throughout_is_silent(seq_first, shard, batch):
    """Sharding any one axis consistently computes the right values: torchtitan's Shard(1)
    on [batch, seq, d] (seq), Shard(0) on [seq, batch, d] (seq), and either plan on the
    other layout (batch). Two blocks, so block 0's scatters reach block 1's attention
    through its gather. The caller's input is this rank's slice of the sharded axis."""
    x = example_input(batch=batch)  # [batch, 5, 192]: 5 is this rank's seq or batch slice
    if seq_first:
        x = x.transpose(0, 1).contiguous()
    plan = _layers_plan(_layer_plan(shard), _layer_plan(shard))
    trace = _layer_trace(plan, x, model=_Layers(seq_first=seq_first))
    assert trace.findings == [], [f.message for f in trace.findings]


# Realistic sizes: batch 4, 8 heads (4 per rank), seq 64 (32 per rank), d_k 64: seq == d_k.
_REAL = {"batch": 4, "seq": 32, "dim": 512, "heads": 8}


def _real_input(seq_first=False):
    x = torch.randn(_REAL["batch"], _REAL["seq"], _REAL["dim"])
    return x.transpose(0, 1).contiguous() if seq_first else x


@pytest.mark.no_shapeguard
def test_at_realistic_sizes_a_seq_scatter_gathered_along_batch_warns():
    first = {k: v for k, v in _layer_plan(1).items() if k.startswith("attention")}
    model = _Layers("attention", dim=_REAL["dim"], heads=_REAL["heads"])
    with pytest.warns(ShapeWarning):
        trace = _layer_trace(_layers_plan(first, _layer_plan(0)), _real_input(), model=model)
    (finding,) = _mismatches(trace)
    assert finding.message.splitlines()[0].startswith(
        "linear: layers.1.attention reads [8, 32, 512] (wq's input), layers.1.attention's "
        "all_gather along dim 0 of a tensor declared Shard(0): its local [4, 32, 512] is this "
        "rank's 32 of seq's 64, split by layers.0.attention.wo's reduce-scatter along seq"
    )


@pytest.mark.parametrize("shard", [0, 1])
@pytest.mark.parametrize("seq_first", [False, True], ids=["bsd", "sbd"])
def test_at_realistic_sizes_a_plan_that_shards_one_axis_throughout_is_silent(seq_first, shard):
    plan = _layers_plan(_layer_plan(shard), _layer_plan(shard))
    model = _Layers(seq_first=seq_first, dim=_REAL["dim"], heads=_REAL["heads"])
    trace = _layer_trace(plan, _real_input(seq_first), model=model)
    assert trace.findings == [], [f.message for f in trace.findings]


def test_plain_tensor_parallelism_without_sequence_parallel_is_silent():
    plain = _layer_plan(sequence_parallel=False)
    trace = _layer_trace(_layers_plan(plain, plain), example_input(seq=2 * S), model=_Layers())
    assert trace.findings == [], [f.message for f in trace.findings]


class _ThenSeqFirst(torch.nn.Module):
    """An attention sublayer on [batch, seq, d], a transpose, then a block on [seq, batch, d]."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([_AttentionSublayer(), _Layer(seq_first=True)])

    def forward(self, x):
        h = self.layers[0](x)
        return self.layers[1](h.transpose(0, 1))


def _then_seq_first(declared):
    first = {k: v for k, v in _layer_plan(1).items() if k.startswith("attention")}
    plan = _layers_plan(first, _layer_plan(declared))
    return _layer_trace(plan, example_input(), model=_ThenSeqFirst())


def test_the_split_axis_follows_a_transpose_so_declaring_seq_after_it_is_silent():
    """wo scatters seq, dim 1 of [batch, seq, d]; the user's transpose moves it to dim 0,
    and the block after it declares Shard(0): seq, right."""
    trace = _then_seq_first(0)
    assert trace.findings == [], [f.message for f in trace.findings]


@pytest.mark.no_shapeguard
def test_the_split_axis_follows_a_transpose_and_the_hint_names_the_producers_layout():
    """The same, declaring Shard(1) (batch after the transpose): the gather stacks seq
    slices as batch items. wo's own plan still says Shard(1): the hint keeps its layout."""
    with pytest.warns(ShapeWarning):
        trace = _then_seq_first(1)
    (finding,) = _mismatches(trace)
    assert (
        f"declared Shard(1): its local [{S}, {B}, {DIM}] is this rank's {S} of seq's {2 * S}, "
        "split by layers.0.attention.wo's reduce-scatter along seq (Partial -> Shard(1))"
    ) in finding.message
    assert finding.hint == (
        "declare Shard(0) where layers.1.attention_norm takes it (SequenceParallel("
        "sequence_dim=0), or input_layouts=Shard(0)), to match RowwiseParallel(output_layouts="
        "Shard(1)) on layers.0.attention.wo (its dim 1 is dim 0 here); or shard dim 1 "
        "throughout: RowwiseParallel(output_layouts=Shard(0)) on layers.0.attention.wo and "
        "every other producer of this tensor, Shard(1) wherever the plan takes it"
    )
