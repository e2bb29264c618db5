"""Tensor-parallel and multi-rank runs: simulated ranks in one process, real ranks spawned
with their findings brought back.

- `fake_tp(tp, rank=0)`: play rank `rank` of a `tp`-way tensor-parallel run in this
  process, on torch's fake process group (no communication, collectives do nothing):
  `parallelize_module` and DTensor give this rank's local shapes, on cpu or meta.
- `free_port()`: a free port on 127.0.0.1, for a loopback rendezvous of real ranks.

Importing this module imports no torch; each function imports what it needs.
"""

import contextlib
import socket

from ._errors import ContractError


def _register_fake() -> None:
    """torch's `fake` backend, registered as torch's own test helper does."""
    import torch.distributed as dist

    if "FAKE" in getattr(dist.Backend, "_plugins", {}):
        return
    from torch._C._distributed_c10d import FakeProcessGroup

    def create(common_opts, backend_opts):
        return FakeProcessGroup._create_internal(
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
        raise ContractError(f"fake_tp(tp={tp!r}): tp must be a positive int")
    if not isinstance(rank, int) or not 0 <= rank < tp:
        raise ContractError(f"fake_tp(tp={tp}, rank={rank!r}): rank must be in 0..{tp - 1}")
    if dist.is_initialized():
        raise ContractError(
            "fake_tp: a process group is already initialized in this process; "
            "destroy it first (dist.destroy_process_group())"
        )
    _register_fake()
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("fake", store=dist.HashStore(), rank=rank, world_size=tp)
    try:
        yield init_device_mesh("cpu", (tp,), mesh_dim_names=(mesh_dim,))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    """A free TCP port on 127.0.0.1, for a loopback rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


__all__ = ["fake_tp", "free_port"]
