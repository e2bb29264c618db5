"""The target shape a view or reshape asks for, and whether `view` can give it without a
copy: read by the view rules (`heads_view`, `regroup`)."""

from math import prod


def target_shape(args: tuple, kwargs: dict) -> tuple[int, ...] | None:
    raw = args[1:] if len(args) > 1 else (kwargs.get("shape") or kwargs.get("size") or ())
    if len(raw) == 1 and isinstance(raw[0], tuple | list):  # torch.Size is a tuple
        raw = tuple(raw[0])
    if not raw or not all(isinstance(s, int) for s in raw):
        return None  # view(dtype), or symbolic sizes: not a shape we can reason about
    return tuple(int(s) for s in raw)


def view_compatible(
    shape: tuple[int, ...], stride: tuple[int, ...], target: tuple[int, ...]
) -> bool:
    """Whether `view` can give `target` without copying: each run of target axes must
    come from source axes that are laid out one after the other in memory."""
    if prod(shape) == 0 or not shape:
        return True
    view_d = len(target) - 1
    chunk_stride = stride[-1]
    tensor_numel = 1
    view_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        chunk_ends = d == 0 or (shape[d - 1] != 1 and stride[d - 1] != tensor_numel * chunk_stride)
        if chunk_ends:
            while view_d >= 0 and (view_numel < tensor_numel or target[view_d] == 1):
                view_numel *= target[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return False
            if d > 0:
                chunk_stride = stride[d - 1]
                tensor_numel = 1
                view_numel = 1
    return view_d == -1
