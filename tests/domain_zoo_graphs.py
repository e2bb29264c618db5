"""Graphs in the domain zoo: GAT, dense (pyGAT: an adjacency matrix masks [heads, N, N]
scores) and sparse (torch_geometric: scores per edge, a softmax over each target's incoming
edges by scatter). Nodes are seq, node features in_channels; there is no batch axis."""

import torch
import torch.nn.functional as F
from domain_zoo_sizes import Sizes
from torch import nn


def edges(n: int) -> torch.Tensor:
    """[2, E] (source, target): self-loops, a ring, and a chord j -> j + 2 (directed)."""
    nodes = torch.arange(n)
    src = torch.cat([nodes, nodes, nodes])
    dst = torch.cat([nodes, (nodes + 1) % n, (nodes + 2) % n])
    return torch.unique(torch.stack([src, dst]), dim=1)


def dense_inputs(s: Sizes) -> tuple:
    """Node features and adj[target, source] = 1 for an edge source -> target."""
    src, dst = edges(s.seq)
    adj = torch.zeros(s.seq, s.seq)
    adj[dst, src] = 1.0
    return torch.randn(s.seq, s.in_channels), adj


def sparse_inputs(s: Sizes) -> tuple:
    return torch.randn(s.seq, s.in_channels), edges(s.seq)


class DenseGAT(nn.Module):
    def __init__(self, s: Sizes, bug=None):
        super().__init__()
        self.heads, self.d_k, self.bug = s.heads, s.d_k, bug
        self.W = nn.Linear(s.in_channels, s.heads * s.d_k, bias=False)
        self.a_src = nn.Parameter(torch.randn(s.heads, s.d_k) * 0.1)
        self.a_dst = nn.Parameter(torch.randn(s.heads, s.d_k) * 0.1)

    def forward(self, x, adj):
        N = x.shape[0]
        Wh = self.W(x).view(N, self.heads, self.d_k).transpose(0, 1)  # [heads, N, d_k]
        e_src = (Wh * self.a_src[:, None, :]).sum(-1)  # [heads, N]
        e_dst = (Wh * self.a_dst[:, None, :]).sum(-1)
        e = F.leaky_relu(e_dst[:, :, None] + e_src[:, None, :], 0.2)  # [heads, target, source]
        e = e.masked_fill(adj[None] == 0, float("-inf"))
        if self.bug == "gat_softmax_side":
            attention = torch.softmax(e, dim=1)  # <- gat_softmax_side
        else:
            attention = torch.softmax(e, dim=-1)
        if self.bug == "gat_aggregate_transposed":
            out = attention.transpose(-1, -2) @ Wh  # <- gat_aggregate_transposed
        else:
            out = attention @ Wh  # [heads, N, d_k]  # <- gat_softmax_side (summed here)
        if self.bug == "gat_heads_merge":
            return F.elu(out.reshape(N, self.heads * self.d_k))  # <- gat_heads_merge
        return F.elu(out.transpose(0, 1).reshape(N, self.heads * self.d_k))


class SparseGAT(nn.Module):
    def __init__(self, s: Sizes, bug=None):
        super().__init__()
        self.heads, self.d_k, self.bug = s.heads, s.d_k, bug
        self.W = nn.Linear(s.in_channels, s.heads * s.d_k, bias=False)
        self.a_src = nn.Parameter(torch.randn(1, s.heads, s.d_k) * 0.1)
        self.a_dst = nn.Parameter(torch.randn(1, s.heads, s.d_k) * 0.1)

    def forward(self, x, edge_index):
        N = x.shape[0]
        Wh = self.W(x).view(N, self.heads, self.d_k)
        src, dst = edge_index
        alpha = (Wh * self.a_src).sum(-1)[src] + (Wh * self.a_dst).sum(-1)[dst]  # [E, heads]
        alpha = F.leaky_relu(alpha, 0.2)
        group = src if self.bug == "gat_sparse_softmax_src" else dst  # <- gat_sparse_softmax_src
        # torch_geometric's softmax(src, index): subtract each group's max, normalise by its sum.
        top = torch.full((N, self.heads), float("-inf")).scatter_reduce(
            0, group[:, None].expand(-1, self.heads), alpha, "amax"
        )
        alpha = (alpha - top[group]).exp()
        total = torch.zeros(N, self.heads).index_add(0, group, alpha)
        alpha = alpha / total[group]  # <- gat_sparse_softmax_src
        messages = alpha[..., None] * Wh[src]  # [E, heads, d_k]
        out = torch.zeros(N, self.heads, self.d_k)
        out = out.index_add(0, dst, messages)  # <- gat_sparse_softmax_src (summed here)
        return F.elu(out.reshape(N, self.heads * self.d_k))
