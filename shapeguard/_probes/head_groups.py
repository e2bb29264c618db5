"""nn.MultiheadAttention's heads as blocks of rows, for permuting them.

torch's own attention module runs as one composite op (its inside is not traced, so
`head_layout` sees no heads axis in it); its layout is torch's documented one:
`in_proj_weight` stacks the Q, K and V projections, each `num_heads` blocks of
`head_dim` rows, and `out_proj` reads the heads in the same order.
"""

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class Rows:
    """A block of a parameter along one axis that holds `heads` heads of `d_k` each."""

    param: str  # parameter name in the model
    axis: int
    offset: int
    heads: int
    d_k: int
    kv: bool = False  # permuted with the kv-head permutation


@dataclass(slots=True)
class HeadGroup:
    """One attention layer's projections, as blocks of head rows (Q/K/V) and columns (out)."""

    name: str
    heads: int
    kv_heads: int
    d_k: int
    rows: list[Rows]


def mha_groups(model) -> list[HeadGroup]:
    """Every nn.MultiheadAttention of `model` with one packed input projection."""
    groups = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.MultiheadAttention):
            continue
        heads = module.num_heads
        if heads < 2 or not module._qkv_same_embed_dim or module.bias_k is not None:
            continue
        base = f"{name}." if name else ""
        e, d_k = module.embed_dim, module.head_dim
        rows = [Rows(f"{base}in_proj_weight", 0, i * e, heads, d_k) for i in range(3)]
        if module.in_proj_bias is not None:
            rows += [Rows(f"{base}in_proj_bias", 0, i * e, heads, d_k) for i in range(3)]
        rows.append(Rows(f"{base}out_proj.weight", 1, 0, heads, d_k))
        groups.append(HeadGroup(name, heads, heads, d_k, rows))
    return groups
