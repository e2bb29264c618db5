"""Whether a tensor the CLI would make fits: torch's size limit and this machine's free
memory, checked before any allocation; and dtypes by name, as `--input` spells them."""

from .loader import LoadError

# The largest size (and element count) torch takes.
_MAX_SIZE = 2**63 - 1


def check_indexable(what: str, shape: tuple[int, ...]) -> None:
    """A size or an element count past what torch can index is a usage error, even on meta."""
    count = 1
    for size in shape:
        count *= size
    if any(size > _MAX_SIZE for size in shape) or count > _MAX_SIZE:
        raise LoadError(
            f"{what}: {'a size' if any(size > _MAX_SIZE for size in shape) else 'the element count'}"
            " is larger than torch allows (2**63 - 1); give smaller sizes"
        )


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _available_memory() -> int | None:
    """Bytes of memory free for new allocations (Linux), or None when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _shape_text(name: str, shape, dtype) -> str:
    return f"{name}=[{', '.join(map(str, shape))}] {str(dtype).removeprefix('torch.')}"


def check_size(name: str, shape: tuple[int, ...], dtype, device: str) -> None:
    """A LoadError, before any allocation, for a tensor torch cannot index or (on cpu) one
    larger than the memory this machine has free."""
    check_indexable(f"input {name}", shape)
    if device != "cpu":
        return
    count = 1
    for size in shape:
        count *= size
    needed = count * dtype.itemsize
    free = _available_memory()
    if free is not None and needed > free:
        raise LoadError(
            f"{_shape_text(name, shape, dtype)} needs {_human(needed)} on cpu, more than is free "
            f"({_human(free)}); use --device meta to check shapes with no memory"
        )


def memory_error(name: str, shape, dtype, device: str, error: BaseException) -> LoadError:
    """The LoadError for a tensor that could not be made (torch's allocator refused it)."""
    count = 1
    for size in shape:
        count *= size
    return LoadError(
        f"cannot make {_shape_text(name, shape, dtype)} on {device} "
        f"({_human(count * dtype.itemsize)}): {type(error).__name__}; "
        "use --device meta to check shapes with no memory"
    )


def dtype_of(name: str, item: str = ""):
    """The torch dtype called `name` (aliases: float, double, half, long, int)."""
    import torch

    aliases = {
        "float": "float32",
        "double": "float64",
        "half": "float16",
        "long": "int64",
        "int": "int64",
    }
    value = getattr(torch, aliases.get(name, name), None)
    if not isinstance(value, torch.dtype):
        raise LoadError(
            f"--input {item!r}: {name!r} is not a torch dtype; use e.g. float32, bfloat16, bool, int64"
        )
    return value
