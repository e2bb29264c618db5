"""Several ranks from the command line: `trace --tp` (simulated ranks, one subprocess each,
on torch's fake process group) and real gloo ranks under torchrun (2-3 CPU ranks on the
127.0.0.1 loopback, one torchrun at a time across pytest-xdist workers, each bounded by
a timeout). The model is tests/cli_models/tp_llama.py: batch 3, seq 5, dim 192, 12 heads
of 16, 4 kv heads (at tp=2: 6 and 2 local, pairwise distinct)."""

import contextlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

from shapeguard import _merge
from shapeguard.distributed import free_port

pytest.importorskip("torch.distributed.tensor")

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "cli_models"
TIMEOUT = 180  # seconds per command; a rank waiting on a dead peer must not hang the suite

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="gloo on loopback, POSIX only")


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(MODELS)])}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "COLUMNS"):
        env.pop(name, None)
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def _shapeguard(*args, cwd=MODELS) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shapeguard", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=_env(),
        timeout=TIMEOUT,
    )


@contextlib.contextmanager
def _one_torchrun_at_a_time():
    """Real ranks run serially: xdist workers take turns (a lock file), so two jobs never
    compete for the two cores or the loopback ports."""
    import fcntl

    path = pathlib.Path(tempfile.gettempdir()) / "shapeguard-tests-gloo.lock"
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _torchrun(nproc: int, *args) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "-m",
        "shapeguard",
        *map(str, args),
    ]
    with _one_torchrun_at_a_time():
        return subprocess.run(
            command, capture_output=True, text=True, cwd=MODELS, env=_env(), timeout=TIMEOUT
        )


def _groups(merged) -> list[tuple]:
    return sorted(
        (
            g.kind,
            g.where,
            tuple(g.ranks),
            tuple(sorted({f["relation"] for f in g.by_rank.values()})),
        )
        for g in merged.groups
    )


def _merged_files(folder: pathlib.Path, world: int):
    reports = {}
    for r in range(world):
        report = _merge.load(str(folder / f"trace.rank{r}.json"))
        assert report["distributed"]["rank"] == r
        assert report["distributed"]["world_size"] == world
        reports[r] = report
    return _merge.merge(reports)


# -- simulated ranks ---------------------------------------------------------------------------
def test_the_default_plan_without_a_parallelize_function(tmp_path):
    source = (MODELS / "tp_llama.py").read_text()
    (tmp_path / "plain.py").write_text(source.split("def parallelize")[0])
    done = _shapeguard("trace", "plain.py", "--tp", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tp=2: no finding on any rank (simulated)" in done.stdout


# -- real ranks ----------------------------------------------------------------------------------
def test_torchrun_prints_one_report_and_merge_gives_the_same_findings(tmp_path):
    done = _torchrun(
        2, "trace", "tp_llama.py", "--arg", "n_kv_heads=3", "--json", tmp_path / "trace.json"
    )
    assert done.returncode != 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines and all(line.startswith(("[rank 0/2] ", "[rank 1/2] ")) for line in lines), lines
    zero = [line[len("[rank 0/2] ") :] for line in lines if line.startswith("[rank 0/2] ")]
    one = [line[len("[rank 1/2] ") :] for line in lines if line.startswith("[rank 1/2] ")]
    assert sum("shapeguard trace" in line for line in zero) == 1  # one table, rank 0's
    assert not any("shapeguard trace" in line for line in one)
    live = {
        line.removeprefix("error: ")
        for line in zero
        if line.startswith("error: ")
    }  # fmt: skip
    assert len(live) == 1
    (relation,) = live
    assert relation.startswith("n_kv_heads=3 is not divisible by tp=2")
    assert one[0] == f"error tp_head_divisibility at tp_llama.py:25: {relation}"
    merged = _merged_files(tmp_path, 2)
    assert _groups(merged) == [
        ("tp_head_divisibility", "wk (Linear) at tp_llama.py:25", (0, 1), (relation,))
    ]
    merge = _shapeguard("merge", *(tmp_path / f"trace.rank{r}.json" for r in range(2)))
    assert merge.returncode == 1
    assert "error tp_head_divisibility on all 2 ranks: wk (Linear) at tp_llama.py:25" in (
        merge.stdout
    )
    assert relation in merge.stdout


def _blocks(text: str) -> list[str]:
    """The finding blocks of a merged report: from `error KIND on RANKS: WHERE` to the blank
    line after it."""
    found, current = [], None
    for line in text.splitlines():
        if line.startswith(("error ", "warning ")) and " on " in line:
            current = [line]
        elif current is not None:
            if not line.strip():
                found.append("\n".join(current))
                current = None
            else:
                current.append(line)
    return found


def test_the_tp_simulator_agrees_with_real_ranks_on_an_uneven_split(tmp_path):
    """tp=3 cuts wk's 64 features 22/22/20: the simulator runs rank 0 and rank 2 (rank 1's
    shards have rank 0's sizes) and must report what three real ranks do; the sweep names
    the degrees that work."""
    from shapeguard._cli import tp as _cli_tp

    real = _torchrun(3, "trace", "tp_llama.py", "--json", tmp_path / "trace.json")
    assert real.returncode != 0, real.stdout + real.stderr[-3000:]
    merged_real = _merged_files(tmp_path, 3)
    assert _groups(merged_real)[0][:3] == (
        "tp_head_divisibility",
        "wk (Linear) at tp_llama.py:25",
        (0, 1, 2),
    )
    first = json.loads((tmp_path / "trace.rank0.json").read_text())
    assert _cli_tp.distinct_ranks(first, 3) == {0: [1], 2: []}
    merge = _shapeguard("merge", *(tmp_path / f"trace.rank{r}.json" for r in range(3)))

    sweep = _shapeguard("trace", "tp_llama.py", "--tp", "2,3")
    assert sweep.returncode == 1, sweep.stderr
    out = sweep.stdout
    assert "tp=2: no finding" in out
    assert "tp=3: 3 ranks of 3 (simulated on torch's fake process group)" in out
    assert "the ranks would hold 22 and 20 of wk's 64 output features" in out
    assert out.rstrip().endswith("of the tp degrees tried (2, 3), these work: 2")
    assert "1 of 2 tp degrees failed in tp_llama.py" in sweep.stderr
    simulated = _blocks(out)
    assert simulated and simulated == _blocks(merge.stdout), (out, merge.stdout)
    assert simulated[0].startswith(
        "error tp_head_divisibility on all 3 ranks: wk (Linear) at tp_llama.py:25"
    )


# -- shapeguard.distributed.spawn: a test body on real ranks -----------------------------------
def _tp_body(rank, world, n_kv_heads):
    """A spawned rank's body: Llama attention on a tp mesh over the real ranks."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from tp_models import Attention, example_input, parallel

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    model = parallel(mesh, Attention(n_kv_heads=n_kv_heads))
    model(example_input())


@pytest.mark.no_shapeguard
def test_spawned_ranks_findings_reach_the_test_and_are_raised(shapeguard):
    from shapeguard import ShapeError
    from shapeguard.distributed import spawn

    with _one_torchrun_at_a_time(), pytest.raises(ShapeError) as info:
        spawn(_tp_body, 2, args=(3,), timeout=TIMEOUT)
    assert info.value.kind == "tp_head_divisibility"
    assert str(info.value).startswith("[all 2 ranks] n_kv_heads=3 is not divisible by tp=2")
    # The test's own trace has it too: a spawned rank is no blind spot for the plugin.
    assert [f.kind for f in shapeguard.findings] == ["tp_head_divisibility"]


def _sp_axis_body(rank, world):
    """tests/test_tp.py's attention sublayer scattering seq (Shard(1)) into a block that
    declares batch (Shard(0)), on real ranks: the warning comes, and the values are what
    it says, wrong where attention mixed tokens across the seq halves (rank 1's; causal
    attention leaves rank 0's first half right). The unparallelized model is the truth."""
    import copy

    import test_tp as T
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    reference = T._Layers("attention")
    for p in reference.parameters():
        torch.nn.init.normal_(p, std=0.2)
    for m in reference.modules():
        if hasattr(m, "n_heads"):
            m.tp = 1
    model = copy.deepcopy(reference)
    for m in model.modules():
        if hasattr(m, "n_heads"):
            m.tp = world
    first = {k: v for k, v in T._layer_plan(1).items() if k.startswith("attention")}
    model = parallelize_module(model, mesh, T._layers_plan(first, T._layer_plan(0)))
    x = torch.randn(3, 10, 192)
    with torch.no_grad():
        want = reference(x)[:, rank * 5 : (rank + 1) * 5]
        got = model(x[:, rank * 5 : (rank + 1) * 5].contiguous())
    if torch.allclose(got, want, atol=1e-4) != (rank == 0):
        raise AssertionError(f"rank {rank}: off by {float((got - want).abs().max())}")


@pytest.mark.no_shapeguard
def test_spawned_ranks_warn_of_a_seq_scatter_gathered_along_batch():
    from shapeguard.distributed import spawn

    with _one_torchrun_at_a_time():
        merged = spawn(_sp_axis_body, 2, timeout=TIMEOUT)
    (group,) = merged.groups
    assert (group.kind, group.ranks) == ("tp_shard_axis_mismatch", [0, 1])
    assert group.where.startswith("Linear at tests/tp_models.py:")  # wq, traced from no root
    for finding in group.by_rank.values():
        assert "all_gather along dim 0 of a tensor declared Shard(0)" in finding["relation"]
        assert "reduce-scatter along seq (Partial -> Shard(1))" in finding["relation"]


def test_the_fake_tp_fixture_plays_one_rank(shapeguard_fake_tp):
    import torch.distributed as dist

    with shapeguard_fake_tp(3, rank=2) as mesh:
        assert (dist.get_rank(), dist.get_world_size(), mesh.size()) == (2, 3, 3)
    assert not dist.is_initialized()
