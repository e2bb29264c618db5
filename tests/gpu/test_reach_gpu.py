"""Attention reach on an accelerator: no reach is read there (values are read from small
CPU tensors only), silently, and the program computes what it computes without shapeguard.

Skipped without a CUDA GPU. Run with `tests/gpu/run_gpu_checks.sh`.
"""

import math

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import shapeguard

B, H, S, D = 3, 4, 7, 16  # pairwise distinct


def _attention(q, k, v):
    future = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(future, float("-inf"))
    keep = ~future
    return F.softmax(scores, dim=-1) @ v, F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def test_no_reach_on_the_gpu_and_outputs_bitwise_identical():
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, generator=g, device="cuda") for _ in range(3))
    plain = _attention(q, k, v)
    with shapeguard.trace() as t:
        traced = _attention(q, k, v)
    assert t.reach == [] and not t.internal_errors
    for a, b in zip(plain, traced, strict=True):
        assert torch.equal(a, b)
