import torch
import torch.nn.functional as F

import shapeguard

past_k = torch.randn(2, 3, 4, 11)  # keys and values cached from a 4-token prefill
past_v = torch.randn(2, 3, 4, 11)
q_new, k_new, v_new = (torch.randn(2, 3, 1, 11) for _ in range(3))  # one new token
with shapeguard.trace():
    k = torch.cat([past_k, k_new], dim=2)  # 4 cached + 1 new keys
    v = torch.cat([past_v, v_new], dim=2)
    new = q_new.shape[2]
    mask = torch.ones(new, new, dtype=torch.bool).tril()  # square over the new tokens
    out = F.scaled_dot_product_attention(q_new, k, v, attn_mask=mask)
