"""The tensors of the structure's leaves: sized and checked first, values from a
private generator, masks with real padding (`inputs_structure`)."""

import zlib

from .inputs_structure import ADD, HIDE, IDS, MASK, Leaf


class Maker:
    """Makes the tensors of leaves: sized and checked first, values from a private generator."""

    def __init__(self, model_dtype, device: str) -> None:
        self.model_dtype = str(model_dtype).removeprefix("torch.")
        self.device = device
        self.lengths: dict[int, tuple[int, ...]] = {}

    def value(self, node):
        if isinstance(node, Leaf):
            return self.tensor(node)
        values = {key: self.tensor(leaf) for key, leaf in node.fields.items()}
        if node.kind == "dataclass":
            return node.cls(**values)
        if node.kind == "namespace":
            import types

            return types.SimpleNamespace(**values)
        return values

    def tensor(self, leaf: Leaf):
        import torch

        from .input_sizes import check_size, dtype_of

        dtype = dtype_of(leaf.dtype_name(self.model_dtype), leaf.name)
        check_size(leaf.name, leaf.shape, dtype, self.device)
        if self.device != "cpu":
            return torch.empty(leaf.shape, dtype=dtype, device=self.device)
        generator = torch.Generator().manual_seed(zlib.crc32(leaf.name.encode()))
        try:
            if leaf.kind == MASK:
                return self._mask(leaf, dtype)
            if leaf.kind == IDS and leaf.vocab and not dtype.is_floating_point:
                high = leaf.vocab if dtype != torch.bool else 2
                return torch.randint(0, high, leaf.shape, generator=generator, dtype=dtype)
            if dtype.is_floating_point or dtype.is_complex:
                return torch.randn(leaf.shape, generator=generator, dtype=dtype)
            if dtype == torch.bool:
                return torch.ones(leaf.shape, dtype=dtype)
            # Integers of unknown use: 0 is a valid id for any embedding.
            return torch.zeros(leaf.shape, dtype=dtype)
        except (RuntimeError, MemoryError) as error:
            from .input_sizes import memory_error

            raise memory_error(leaf.name, leaf.shape, dtype, self.device, error) from None

    def _mask(self, leaf: Leaf, dtype):
        """Padding along the last axis (the keys), one row per example along the first."""
        import torch

        shape = leaf.shape
        seq = shape[-1] if shape else 1
        rows = shape[0] if len(shape) >= 2 else 1
        lengths = padded_lengths(rows, seq) if leaf.padded else (seq,) * rows
        self.lengths[id(leaf)] = lengths if leaf.padded and len(shape) >= 2 else ()
        real = torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]  # [rows, seq]
        if len(shape) >= 2:
            real = real.view(rows, *([1] * (len(shape) - 2)), seq).expand(shape).clone()
        else:
            real = real[0].expand(shape).clone()
        if leaf.polarity == ADD:
            low = torch.finfo(dtype).min if dtype.is_floating_point else -(10**9)
            return torch.where(real, torch.zeros((), dtype=dtype), torch.full((), low, dtype=dtype))
        hidden = ~real if leaf.polarity == HIDE else real
        return hidden.to(dtype)


def padded_lengths(rows: int, seq: int) -> tuple[int, ...]:
    """The first example full, the others shorter, distinct while the length allows.

    >>> padded_lengths(2, 5), padded_lengths(4, 5), padded_lengths(3, 2)
    ((5, 3), (5, 3, 2, 1), (2, 1, 1))
    """
    return (seq, *(max(1, seq - 1 - i) for i in range(1, rows)))
