"""shapeguard.diff with padded inputs: the positions the attention_mask establishes as
padding are not compared where a tensor's axes are tied to the mask's (by the op's
contract, or the one axis of each size), and the report says how many; a tensor whose
axes could be either is compared whole; real positions are compared as ever."""

import pytest
import torch

import shapeguard
from shapeguard._diff.capture import Captured
from shapeguard._diff.padding import Padding, from_inputs, skipped

transformers = pytest.importorskip("transformers")

LEFT = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])


def _captured(shape, axes=None):
    return Captured("k", "", "block", torch.zeros(shape), "float32", axes or (None,) * len(shape))


def test_the_tie_by_contract_by_unique_sizes_and_none_where_two_axes_could_be_it():
    padding = from_inputs({"attention_mask": LEFT})
    assert (padding.count, padding.total) == (4, 21)
    # a module output (batch, seq, features): one axis of each size
    skip = skipped(_captured((3, 7, 64)), padding)
    assert skip.shape == (3, 7, 64) and int(skip[:, :, 0].sum()) == 4 and bool(skip[0, 2].all())
    assert not bool(skip[0, 3].any()) and not bool(skip[2].any())
    # SDPA's context by its contract, (batch, heads, query, head_dim), heads == seq
    sdpa = _captured((3, 7, 7, 16), ("batch", "heads", "query", "head_dim"))
    assert bool(skipped(sdpa, padding)[1, :, 0].all()) and not skipped(sdpa, padding)[1, :, 1].any()
    # scores (.., query, key): the query axis named, batch the one other axis of its size
    scores = skipped(_captured((3, 4, 7, 7), (None, None, "query", "key")), padding)
    assert bool(scores[0, :, 0:3].all()) and not bool(scores[0, :, 3:].any())
    # two axes of the mask's length and none named, or two of the batch's: no tie
    assert skipped(_captured((3, 7, 7)), padding) is None
    assert skipped(_captured((3, 3, 7, 16)), padding) is None
    # a named seq axis of another length (a cache): no tie
    assert (
        skipped(_captured((3, 4, 5, 16), ("batch", "heads", "query", "head_dim")), padding) is None
    )


def test_a_mask_that_is_not_padding_by_position_establishes_none():
    assert from_inputs({}) is None
    assert from_inputs({"attention_mask": torch.ones(3, 7, dtype=torch.long)}) is None
    assert from_inputs({"attention_mask": torch.zeros(3, 7).masked_fill(LEFT == 0, -1e9)}) is None
    assert from_inputs({"attention_mask": torch.ones(2, 3, 7)}) is None
    assert isinstance(from_inputs({"attention_mask": LEFT.bool()}), Padding)


def _llama(seed=0, batch=3, seq=7, heads=4, head_dim=16):
    config = transformers.LlamaConfig(
        vocab_size=100, hidden_size=heads * head_dim, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=heads, head_dim=head_dim,
        max_position_embeddings=64, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(3, 100, (batch, seq), generator=torch.Generator().manual_seed(1))
    return model, ids


def _mask(batch, seq, side):
    mask = torch.ones(batch, seq, dtype=torch.long)
    for b, n in enumerate(range(min(batch, seq) - 1, -1, -1)):  # n padded in example b
        if n:
            mask[b, :n] = 0 if side == "left" else 1
            if side == "right":
                mask[b, seq - n :] = 0
    return mask


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("sizes", [(3, 7, 4, 16), (4, 64, 8, 64)], ids=["distinct", "realistic"])
def test_eager_against_sdpa_with_padding_agrees_off_the_padded_positions(side, sizes):
    batch, seq, heads, head_dim = sizes
    model, ids = _llama(batch=batch, seq=seq, heads=heads, head_dim=head_dim)
    mask = _mask(batch, seq, side)
    result = shapeguard.diff(model, None, ids, attention_mask=mask, backends=("eager", "sdpa"))
    assert result.agree, str(result)
    n = int((mask == 0).sum())
    assert f"  note: padded positions not compared: {n} of {batch * seq} (attention_mask 0)" in str(
        result
    )


def test_where_the_axes_cannot_be_told_apart_padded_rows_are_compared():
    # batch == heads == seq == head_dim: eager's context (.., query, head_dim) has no axis
    # that is the batch by its contract or by a size of its own, so it is compared whole,
    # and transformers' own difference at the padded query rows that see no key shows.
    model, ids = _llama(batch=4, seq=4, heads=4, head_dim=4)
    mask = _mask(4, 4, "left")
    result = shapeguard.diff(model, None, ids, attention_mask=mask, backends=("eager", "sdpa"))
    assert not result.agree
    assert result.first.key == "model.layers.0.self_attn context"
    assert "query 0-2 of 4" in result.first.along()


def test_a_real_difference_is_still_found_at_the_real_positions():
    ref, ids = _llama()
    port, _ = _llama()
    with torch.no_grad():
        port.model.layers[0].self_attn.k_proj.weight.mul_(1.5)
    result = shapeguard.diff(ref, port, ids, attention_mask=_mask(3, 7, "left"), weights="none")
    first = result.first
    assert first.key == "model.layers.0.self_attn.k_proj block"
    # the real positions diverge (all but a few elements near zero), the 3 padded ones are
    # not counted: at most 18 positions x 64 features
    assert 17 * 64 < first.bad <= 18 * 64 and first.total == 21 * 64
    assert "padded positions not compared: 3 of 21" in str(result)
    assert first.difference is not None and first.difference.kind == "scale"
