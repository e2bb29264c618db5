"""The reach's compact store: runs per distinct row, broadcast axes kept at 1, sampled
queries past the stated size, and the text users read."""

import pytest
import torch

from shapeguard._reach.rows import MAX_QUERIES, MAX_RUNS, Reach, count, runs_text, sampled_queries


def causal(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


def test_a_causal_mask_broadcast_over_batch_and_heads_is_stored_once_per_query():
    reach = Reach.from_visible(causal(9)[None, None], lead=(2, 3), op="softmax")
    assert reach.stored == (1, 1)
    assert len(reach.patterns) == 9
    assert reach.row((1, 2), 3) == ((0, 4),)
    assert reach.summary() == "query 8 sees keys 0..8 (9 of 9)"


def test_padding_varies_by_example_only_and_each_row_reads_back():
    visible = causal(9).expand(2, 1, 9, 9).clone()
    visible[1, ..., 7:] = False
    reach = Reach.from_visible(visible, lead=(2, 3))
    assert reach.stored == (2, 1)
    assert reach.row((1, 2), 8) == ((0, 7),)
    assert reach.row((0, 2), 8) == ((0, 9),)
    assert torch.equal(reach.visible((1, 0)), visible[1, 0])
    assert not reach.sees((1, 0), 8, 7) and reach.sees((0, 0), 8, 7)


def test_rows_with_gaps_and_empty_rows_read_as_users_count():
    visible = torch.zeros(3, 8, dtype=torch.bool)
    visible[0, [0, 1, 2, 6, 7]] = True
    visible[1, 3] = True
    reach = Reach.from_visible(visible)
    assert runs_text(reach.row((), 0)) == "keys 0..2, 6..7"
    assert runs_text(reach.row((), 1)) == "key 3"
    assert runs_text(reach.row((), 2)) == "no key"
    assert count(reach.row((), 0)) == 5


def test_long_sequences_keep_a_stated_sample_of_queries():
    reach = Reach.from_visible(causal(4096), lead=(4, 8))
    assert reach.queries is not None and len(reach.queries) == MAX_QUERIES
    assert reach.queries[0] == 0 and reach.queries[-1] == 4095
    assert reach.row((3, 7), 4095) == ((0, 4096),)
    with pytest.raises(ValueError):
        reach.row((0, 0), 4094 - 100)  # not kept: never guessed
    assert sampled_queries(MAX_QUERIES) is None


def test_many_distinct_slices_keep_fewer_queries_each_and_stay_bounded():
    # Every (example, head) slice its own prefix length: 2048 distinct slices of one run per row.
    keys = torch.arange(40)
    limit = (torch.arange(64 * 32).reshape(64, 32, 1, 1) + torch.arange(600).reshape(600, 1)) % 40
    reach = Reach.from_visible(keys <= limit)
    assert reach.stored == (64, 32)
    assert reach.queries is not None and len(reach.queries) == 8
    assert len(reach.rows) == 64 * 32 * 8


def test_no_tensor_is_kept():
    reach = Reach.from_visible(causal(5))
    assert not any(isinstance(getattr(reach, f), torch.Tensor) for f in reach.__slots__)


def test_a_scattered_mask_past_the_runs_bound_is_refused_not_stored_unbounded():
    visible = torch.rand(8, 4, 600, 4096, generator=torch.Generator().manual_seed(0)) > 0.5
    with pytest.raises(ValueError, match=f"past {MAX_RUNS}"):
        Reach.from_visible(visible)


def test_no_keys_gives_empty_rows():
    reach = Reach.from_visible(torch.zeros(2, 3, 0, dtype=torch.bool))
    assert reach.row((1,), 2) == () and reach.summary() == "query 2 sees no key (0 of 0)"


def test_slices_given_whole_and_all_alike_are_stored_once():
    visible = causal(7).expand(3, 4, 7, 7).clone()  # materialized, not broadcast
    reach = Reach.from_visible(visible)
    assert reach.stored == (1, 1) and reach.lead == (3, 4)
    assert reach.row((2, 3), 4) == ((0, 5),)
    visible[1, 2, 0, 6] = True  # one slice differs: its axes are kept
    reach = Reach.from_visible(visible)
    assert reach.stored == (3, 4)
    assert reach.row((1, 2), 0) == ((0, 1), (6, 7)) and reach.row((0, 2), 0) == ((0, 1),)
