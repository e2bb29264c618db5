"""Tensor-parallel and multi-rank runs: simulated ranks in one process, real ranks spawned
with their findings brought back.

- `fake_tp(tp, rank=0)`: play rank `rank` of a `tp`-way tensor-parallel run in this
  process, on torch's fake process group (no communication, collectives do nothing):
  `parallelize_module` and DTensor give this rank's local shapes, on cpu or meta.
- `spawn(fn, nprocs=2)`: run `fn(rank, world_size, *args)` on real gloo ranks on the
  127.0.0.1 loopback, each inside a shapeguard trace, and bring back what the
  ranks found, grouped by the ranks that hit it: added to the caller's trace (under the
  pytest plugin, the test's, so a spawned rank is no blind spot) and raised as a
  ShapeError naming the ranks.
- `free_port()`: a free port on 127.0.0.1, for a loopback rendezvous of real ranks.

Importing this module imports no torch; each function imports what it needs.
"""

import contextlib
import json
import os
import socket
import sys
import tempfile
import time
import traceback

from ._errors import ContractError, ContractTypeError


def register_fake_backend() -> None:
    """torch's `fake` backend, registered as torch's own test helper does (for `fake_tp`
    and `shapeguard trace --tp`)."""
    import torch.distributed as dist

    if "FAKE" in getattr(dist.Backend, "_plugins", {}):
        return
    from torch._C._distributed_c10d import FakeProcessGroup

    def create(common_opts, backend_opts):
        # torch's stub names two arguments; the 2.13 binding takes the options too.
        return FakeProcessGroup._create_internal(  # type: ignore[call-arg]
            common_opts.group_rank, common_opts.group_size, backend_opts
        )

    dist.Backend.register_backend(
        "fake", create, extended_api=True, devices=["cpu", "cuda", "hpu", "xpu"]
    )


@contextlib.contextmanager
def fake_tp(tp: int, rank: int = 0, *, mesh_dim: str = "tp"):
    """Play rank `rank` of a `tp`-way tensor-parallel run in this process.

    Initializes torch's fake process group (world size `tp`) and yields a 1-D CPU
    `DeviceMesh` named `mesh_dim`; the group is destroyed on exit. Build the model (on
    `torch.device("meta")` for any size), `parallelize_module` it on the mesh, and a
    forward runs this rank's local shapes: shapeguard's TP checks see exactly what rank
    `rank` would. One rank per process: torch caches sharding decisions, so simulating
    another rank of an uneven split in the same process can go wrong (`shapeguard trace
    --tp` runs each rank in a fresh process).

    Args:
        tp: the tensor-parallel degree (world size).
        rank: the rank to play.
        mesh_dim: the mesh dim's name.

    Example::

        with shapeguard.distributed.fake_tp(16) as mesh:
            with torch.device("meta"):
                model = Attention(dim=4096, n_heads=32, n_kv_heads=8)
            parallelize_module(model, mesh, plan)
            with shapeguard.trace():
                model(torch.empty(1, 64, 4096, device="meta"))
    """
    import torch.distributed as dist

    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise _wrong_int(tp)(f"fake_tp(tp={tp!r}): tp must be a positive int")
    if not isinstance(rank, int) or not 0 <= rank < tp:
        raise _wrong_int(rank)(f"fake_tp(tp={tp}, rank={rank!r}): rank must be in 0..{tp - 1}")
    if dist.is_initialized():
        raise ContractError(
            "fake_tp: a process group is already initialized in this process; "
            "destroy it first (dist.destroy_process_group())"
        )
    register_fake_backend()
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("fake", store=dist.HashStore(), rank=rank, world_size=tp)
    try:
        yield init_device_mesh("cpu", (tp,), mesh_dim_names=(mesh_dim,))
    finally:
        dist.destroy_process_group()


def _wrong_int(value) -> type[ContractError]:
    """The error for a count that is not a positive int: a TypeError unless it is an int."""
    return (
        ContractError
        if isinstance(value, int) and not isinstance(value, bool)
        else ContractTypeError
    )


def free_port() -> int:
    """A free TCP port on 127.0.0.1, for a loopback rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(fn, rank: int, world: int, port: int, args: tuple, folder: str) -> None:
    """One spawned rank: gloo on the loopback, `fn` inside a trace, its report as JSON."""
    import warnings
    from datetime import timedelta

    import torch.distributed as dist

    from . import _public_trace
    from ._errors import ShapeError, ShapeWarning

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    failure = ""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    trace = _public_trace.Trace(mode="raise")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ShapeWarning)
            try:
                with trace:
                    fn(rank, world, *args)
            except ShapeError:
                pass  # recorded in the trace
            except BaseException:
                failure = traceback.format_exc()
    finally:
        data = trace.to_dict()
        data["failure"] = failure
        with open(os.path.join(folder, f"rank{rank}.json"), "w", encoding="utf-8") as f:
            json.dump(data, f)
        dist.destroy_process_group()


def spawn(fn, nprocs: int = 2, *, args: tuple = (), timeout: float = 120.0, check: bool = True):
    """Run `fn(rank, world_size, *args)` on `nprocs` real gloo ranks (CPU, 127.0.0.1) and
    bring their findings back.

    Each rank is a fresh process (multiprocessing's spawn: `fn` must be importable, a
    module-level function) running `fn` inside a shapeguard trace (the first error stops that rank, as in `trace`). Their
    findings are merged, grouped by the ranks that hit them, and added to the trace open
    in the caller (under the pytest plugin, the test's own), each relation prefixed with
    its ranks (`[ranks 0-1] ...`).

    Args:
        fn: the body, called as `fn(rank, world_size, *args)` on each rank.
        nprocs: how many ranks.
        args: more arguments for `fn` (picklable).
        timeout: seconds for all ranks together; ranks still running then are killed.
        check: raise the first error the ranks found as a ShapeError (and any other
            exception a rank raised as a RuntimeError with its traceback).

    Returns:
        The merged report (`shapeguard._merge.Merged`): `.groups`, each with `.kind`,
        `.ranks` and `.by_rank` (rank -> the finding as JSON).
    """
    import multiprocessing

    from . import _merge

    if not isinstance(nprocs, int) or nprocs < 1:
        raise _wrong_int(nprocs)(f"spawn(nprocs={nprocs!r}): nprocs must be a positive int")
    context = multiprocessing.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="shapeguard-spawn-") as folder:
        procs = [
            context.Process(target=_rank_main, args=(fn, r, nprocs, port, tuple(args), folder))
            for r in range(nprocs)
        ]
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        late = [r for r, proc in enumerate(procs) if proc.is_alive()]
        for r in late:
            procs[r].kill()
            procs[r].join()
        reports, failures = {}, []
        for r in range(nprocs):
            path = os.path.join(folder, f"rank{r}.json")
            if not os.path.exists(path):
                failures.append(f"rank {r} exited with status {procs[r].exitcode} and no report")
                continue
            with open(path, encoding="utf-8") as f:
                reports[r] = json.load(f)
            if reports[r].get("failure"):
                failures.append(f"rank {r} raised:\n{reports[r]['failure']}")
    if late:
        raise TimeoutError(
            f"spawn: {_merge.ranks_text(late, nprocs)} did not finish in {timeout:g}s (killed)"
        )
    merged = _merge.merge(reports)
    errors = _into_caller(merged)
    if check and errors:
        raise errors[0]
    if check and failures:
        raise RuntimeError("spawn: " + "\n".join(failures))
    return merged


def _into_caller(merged) -> list:
    """The merged findings as ShapeErrors, added to the caller's open trace (if any)."""
    from . import _merge
    from ._errors import Operand, ShapeError

    current = None
    current_module = sys.modules.get("shapeguard._trace.current")
    if current_module is not None:
        current = current_module.current_session()
    errors = []
    for group in merged.groups:
        f = group.by_rank[group.ranks[0]]
        error = ShapeError(
            f"[{_merge.ranks_text(group.ranks, merged.world_size)}] {f.get('relation', '')}",
            kind=f.get("kind", group.kind),
            op=f.get("op", ""),
            module=f.get("module", ""),
            location=f.get("location", ""),
            source=f.get("source", ""),
            operands=[
                Operand(o.get("name", ""), o.get("shape", "")) for o in f.get("operands", [])
            ],
            hint=f.get("hint", ""),
        )
        if current is not None:
            current.trace.add_finding(error, group.severity)
        if group.severity == "error":
            errors.append(error)
    return errors


__all__ = ["fake_tp", "free_port", "spawn"]
