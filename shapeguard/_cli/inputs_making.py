"""The tensors of the structure's leaves: sized and checked first, values from a
private generator, masks with real padding (`inputs_structure`)."""

import zlib

from .inputs_structure import ADD, HIDE, IDS, MASK, Leaf


class Maker:
    """Makes the tensors of leaves: sized and checked first, values from a private generator.

    Token ids never take a padding id the model declares (`pads`: an embedding's
    `padding_idx`, a config's `pad_token_id`): ids of padding read as padding, and the
    checks would see masks hide tokens the inputs meant as real. Integers of a use not
    seen (read first by a comparison, or only by a loss) are ids below the model's
    smallest vocabulary (`vocab`), when it has an embedding: zeros are the usual pad id.
    """

    def __init__(self, model_dtype, device: str, *, pads=frozenset(), vocab: int = 0) -> None:
        self.model_dtype = str(model_dtype).removeprefix("torch.")
        self.device = device
        self.lengths: dict[int, tuple[int, ...]] = {}
        self.pads = frozenset(pads)
        self.vocab = vocab

    def ids_range(self, leaf: Leaf) -> tuple[int, ...]:
        """The ids a leaf's values are drawn from: below its vocabulary, no padding id."""
        vocab = leaf.vocab or self.vocab
        allowed = tuple(i for i in range(vocab) if i not in self.pads)
        return allowed or tuple(range(vocab))

    def ids_note(self, leaf: Leaf) -> str:
        """`ids 1..10` (padding id 0 left out), `ids 0..10 but 3`, `ids < 11`."""
        allowed = self.ids_range(leaf)
        if not allowed:
            return ""
        vocab = leaf.vocab or self.vocab
        skipped = [i for i in range(allowed[0], allowed[-1]) if i not in allowed]
        if not skipped and allowed[0] == 0 and allowed[-1] == vocab - 1:
            return f"ids < {vocab}"
        but = f" but {', '.join(map(str, skipped))}" if skipped else ""
        return f"ids {allowed[0]}..{allowed[-1]}{but}"

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
            if dtype == torch.bool and leaf.kind == IDS and leaf.vocab:
                return torch.randint(0, 2, leaf.shape, generator=generator, dtype=dtype)
            if dtype.is_floating_point or dtype.is_complex:
                return torch.randn(leaf.shape, generator=generator, dtype=dtype)
            if dtype == torch.bool:
                return torch.ones(leaf.shape, dtype=dtype)
            allowed = self.ids_range(leaf)
            if allowed:
                picks = torch.randint(0, len(allowed), leaf.shape, generator=generator)
                return torch.tensor(allowed)[picks].to(dtype)
            # Integers of unknown use in a model with no embedding: 0 indexes anything.
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
