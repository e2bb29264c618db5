"""What the tensor-parallel rules (`checks/tp.py`) read of the trace: one read-only view.

A rule reaches it as `call.tp` (`CallView.tp`), None while `torch.distributed.tensor` is
not imported. The session's `_trace/tp_session.SessionTP` implements it; no rule that is
not about tensor parallelism reads it (tests/test_structure.py).
"""

from typing import Any, Protocol


class TPView(Protocol):
    """Tensor parallelism in the running trace, as the tp rules read it."""

    def owner(self) -> tuple[Any, Any]: ...  # (module, its `_tp.Sharding`) or (None, None)
    def replicated(self, local, mesh, mesh_dim: int) -> Any: ...  # `Replicated` or None
    def any_replicated(self) -> bool: ...  # a collective replicated a tensor of the trace
    def tiled(self, tensor) -> Any: ...  # `Replicated` (a gather of one) or None
    def any_gathered(self) -> bool: ...  # a reduce-scatter's piece was gathered in the trace
    def gathered(self, tensor) -> Any: ...  # `Gathered` (of a `Split`) or None
