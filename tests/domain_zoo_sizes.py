"""The three size settings of the domain zoo (tests/domain_zoo.py)."""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sizes:
    """One size setting. seq is the query-side tokens (an image grid's, a clip's frames, a
    series' steps, a graph's nodes, the latents); seq_k the other side's (text, media, inputs);
    grid the image tokens' grid (its product is the image's token count), patch the pixels per
    patch side, in_channels the image channels, mel bins or series variables; window the Swin
    window side and windows the windows per image side."""

    name: str
    batch: int
    heads: int
    seq: int
    seq_k: int
    d_k: int
    grid: tuple[int, int]
    patch: int
    in_channels: int
    window: int
    windows: tuple[int, int]

    @property
    def d_model(self) -> int:
        return self.heads * self.d_k

    @property
    def tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def image(self) -> tuple[int, int]:
        return self.grid[0] * self.patch, self.grid[1] * self.patch

    def padding(self, length: int) -> torch.Tensor:
        """[batch, length] bools, True for real positions: the first example is full, the
        others right-padded to different, non-empty lengths."""
        lengths = [length - (i * (length - 1)) // (self.batch + 1) for i in range(self.batch)]
        return torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]


# Pairwise distinct: batch 3, heads 4, seq 7, seq_k 5, d_k 16, 2 x 5 image tokens.
DISTINCT = Sizes("distinct", 3, 4, 7, 5, 16, (2, 5), 9, 6, 3, (2, 3))
# Coincident: batch == seq == seq_k == heads == d_k == image tokens == window tokens == 4.
COINCIDENT = Sizes("coincident", 4, 4, 4, 4, 4, (2, 2), 2, 4, 2, (2, 2))
# One layer of a real model: heads 8, d_k 64, 64 queries or image tokens (8 x 8), 77 text tokens.
REALISTIC = Sizes("realistic", 4, 8, 64, 77, 64, (8, 8), 4, 3, 8, (2, 2))
SETTINGS = (DISTINCT, COINCIDENT, REALISTIC)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)
