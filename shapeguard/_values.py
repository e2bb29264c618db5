"""What every layer asks of a value: whether it is a tensor, and its dtype's name.

Pure Python at import: torch is imported by the first `is_tensor` call (by then a trace,
a probe or a command has loaded it anyway).
"""

from typing import TYPE_CHECKING, TypeGuard

from ._memo import Memo

if TYPE_CHECKING:
    import torch

# torch.Tensor, once something has asked.
_Tensor: type | None = None


def is_tensor(value) -> TypeGuard["torch.Tensor"]:
    """Whether `value` is a torch tensor (a subclass too: a Parameter, a DTensor). Never
    duck-typed: a NumPy scalar or array, or an fx Proxy, has a `shape` and a `dtype` too,
    and goes to torch as it is (a rule that took it for a tensor would read its axes)."""
    return isinstance(value, _Tensor or _tensor_class())


def _tensor_class() -> type:
    global _Tensor
    import torch

    _Tensor = torch.Tensor
    return _Tensor


# dtype -> its name: the session asks for every tensor it records.
# (torch has a few dozen dtypes; the bound only guards against a caller that makes its own).
_DTYPE_NAMES = Memo("dtype names", 256)


def dtype_name(dtype) -> str:
    """`float32` for `torch.float32` (a NumPy dtype or a name as it is)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES.put(dtype, str(dtype).removeprefix("torch."))
    return name
