import torch
import torch.nn.functional as F
from torch import nn

import shapeguard


class GATLayer(nn.Module):
    """Graph attention over edge_index [2, edges]: a softmax over each node's edges, then
    the weighted messages summed into the nodes."""

    def __init__(self, d_in=16, heads=4, d_out=8):
        super().__init__()
        self.heads, self.d_out = heads, d_out
        self.lin = nn.Linear(d_in, heads * d_out, bias=False)
        self.att_src = nn.Parameter(torch.randn(1, heads, d_out))
        self.att_dst = nn.Parameter(torch.randn(1, heads, d_out))

    def forward(self, x, edge_index):
        N = x.shape[0]
        h = self.lin(x).view(N, self.heads, self.d_out)  # [nodes, heads, d_out]
        src, dst = edge_index[0], edge_index[1]
        a_src, a_dst = (h * self.att_src).sum(-1), (h * self.att_dst).sum(-1)
        e = F.leaky_relu(a_src.index_select(0, src) + a_dst.index_select(0, dst), 0.2)
        w = e.exp()  # [edges, heads]
        w_sum = w.new_zeros(N, self.heads).index_add_(0, src, w)  # grouped by the sources
        alpha = w / w_sum.index_select(0, src)
        msg = h.index_select(0, src) * alpha.unsqueeze(-1)  # [edges, heads, d_out]
        out = msg.new_zeros(N, self.heads, self.d_out).index_add_(0, dst, msg)
        return out.reshape(N, self.heads * self.d_out)


edge_index = torch.tensor([[0, 1, 2, 3, 4, 0, 2], [1, 2, 3, 4, 0, 3, 4]])
shapeguard.trace(GATLayer(), torch.randn(5, 16), edge_index)
