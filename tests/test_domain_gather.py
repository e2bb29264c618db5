"""A gather along the features with an index copied along them (issue 32): MAE's random
masking (written from scratch after facebookresearch/mae `random_masking`) with `dim=2`
where `dim=1` is meant, when keeping the visible patches or restoring their order. It runs
whenever d_model >= the number of patches, and each output row is then one element of the
row repeated. The evidence is structural: the index is a broadcast copy along the gather
axis (a repeat of an unsqueezed axis), and that axis of x holds a projection's features.
"""

import warnings

import bug_zoo as zoo
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import shapeguard
from shapeguard import ShapeWarning

pytestmark = pytest.mark.no_shapeguard  # the bugs warn on purpose

SETTING = pytest.mark.parametrize("sizes", zoo.SETTINGS, ids=lambda s: s.name)


def patch_width(sizes) -> int:
    return sizes.channels * sizes.patch * sizes.patch


class RandomMasking(nn.Module):
    """Patch embedding, then MAE's masking: keep a random subset of the patches (gather by
    ids_keep), append mask tokens and put them back in order (gather by ids_restore).
    `bug`: "keep" or "restore" gathers along dim 2, the features. `copy`: how the index is
    copied along the features, MAE's `repeat` or an `expand`."""

    def __init__(self, sizes, bug=None, copy="repeat"):
        super().__init__()
        self.embed = nn.Linear(patch_width(sizes), sizes.d_model)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, sizes.d_model))
        self.bug, self.copy = bug, copy

    def along_features(self, ids, D):
        ids = ids.unsqueeze(-1)
        return ids.repeat(1, 1, D) if self.copy == "repeat" else ids.expand(-1, -1, D)

    def forward(self, patches, mask_ratio=0.5):
        x = self.embed(patches)
        N, L, D = x.shape
        len_keep = max(1, int(L * (1 - mask_ratio)))
        noise = torch.rand(N, L)
        ids_shuffle = torch.argsort(noise, dim=1)
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        ids_keep = ids_shuffle[:, :len_keep]
        keep_dim = 2 if self.bug == "keep" else 1
        x_masked = torch.gather(x, dim=keep_dim, index=self.along_features(ids_keep, D))
        mask_tokens = self.mask_token.repeat(N, L - len_keep, 1)
        x_ = torch.cat([x_masked, mask_tokens], dim=1)
        restore_dim = 2 if self.bug == "restore" else 1
        index = self.along_features(ids_restore, D)
        return torch.gather(x_, dim=restore_dim, index=index)


def findings(model, *args):
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", ShapeWarning)
        return shapeguard.trace(model, *args, mode="warn").findings


def patches(sizes):
    torch.manual_seed(0)
    return torch.randn(sizes.batch, sizes.seq, patch_width(sizes))


def messages(found) -> list[str]:
    return [f"[{f.kind}] {f.message}" for f in found]


# -- the bug -----------------------------------------------------------------------------------
@SETTING
@pytest.mark.parametrize("copy", ("repeat", "expand"))
@pytest.mark.parametrize("bug", ("keep", "restore"))
def test_a_gather_along_the_features_is_found(bug, copy, sizes):
    found = findings(RandomMasking(sizes, bug, copy), patches(sizes))
    assert [f.kind for f in found] == ["gather_axis"], messages(found)
    (finding,) = found
    d = sizes.d_model
    assert (
        f", dim=2, index): index is a copy along axis 2 (repeat or expand: one value for all {d} places)"
        in (finding.message)
    )
    assert (
        f"each output row is one element of {finding.operands[0].name} repeated" in finding.message
    )
    assert "dim=1, the tokens" in finding.hint
    line = "x_masked = torch.gather(" if bug == "keep" else "return torch.gather(x_"
    assert finding.source.startswith(line), finding.source


def test_the_message_in_full():
    sizes = zoo.DISTINCT
    (finding,) = findings(RandomMasking(sizes, "keep"), patches(sizes))
    assert finding.relation == (
        "x_masked = torch.gather(x, dim=2, index): index is a copy along axis 2 (repeat or "
        "expand: one value for all 33 places), and axis 2 of x is its features (33): each "
        "output row is one element of x repeated, not a gather of rows"
    )
    assert [(o.name, o.shape) for o in finding.operands] == [
        ("x", "[batch=2, seq=5, 33] float32"),
        ("index", "[2, 2, 33] int64"),
    ]
    assert finding.hint == (
        "gather along the axis the index's values address (dim=1, the tokens for ids from an "
        "argsort or top-k over them), with the index copied along the features: "
        "torch.gather(x, dim=1, index=ids.unsqueeze(-1).expand(-1, -1, 33))"
    )


# -- what is right stays silent ------------------------------------------------------------------
@SETTING
@pytest.mark.parametrize("copy", ("repeat", "expand"))
def test_mae_masking_and_unshuffle_are_clean(copy, sizes):
    assert findings(RandomMasking(sizes, None, copy), patches(sizes)) == []


class TokenSelection(nn.Module):
    """Gathers along the tokens and the vocabulary, each as its code says: take_along_dim and
    index_select on the token axis, top-k tokens by a score, a loss's gather of the targets'
    log-probabilities, and a gather by an index handed in (its provenance unknown)."""

    def __init__(self, sizes, vocab: int):
        super().__init__()
        self.embed = nn.Linear(patch_width(sizes), sizes.d_model)
        self.score = nn.Linear(sizes.d_model, 1)
        self.head = nn.Linear(sizes.d_model, vocab)

    def forward(self, patches, targets, given):
        x = self.embed(patches)
        N, L, D = x.shape
        k = max(1, L // 2)
        order = torch.randperm(L)
        shuffled = torch.index_select(x, 1, order)
        ids = torch.argsort(torch.rand(N, L), dim=1)
        taken = torch.take_along_dim(shuffled, ids.unsqueeze(-1), dim=1)
        top = torch.topk(self.score(taken).squeeze(-1), k, dim=1).indices
        picked = torch.gather(taken, 1, top.unsqueeze(-1).expand(-1, -1, D))
        logp = F.log_softmax(self.head(picked), dim=-1)
        nll = -torch.gather(logp, -1, targets[:, :k].unsqueeze(-1)).mean()
        handed = torch.gather(x, 2, given)
        return nll + handed.mean()


@SETTING
def test_gathers_along_tokens_and_vocabulary_are_clean(sizes):
    vocab = 2 * sizes.d_model + 1
    targets = torch.randint(vocab, (sizes.batch, sizes.seq))
    given = torch.randint(sizes.d_model, (sizes.batch, sizes.seq, sizes.d_model))
    model = TokenSelection(sizes, vocab)
    found = findings(model, patches(sizes), targets, given)
    assert found == [], messages(found)


class RelativeBuckets(nn.Module):
    """A relative-position bias gathered from a projection's buckets (ProphetNet's): the index
    is made from a repeat minus the positions, so it varies along the gathered axis although
    one of its terms is a copy there."""

    def __init__(self, sizes):
        super().__init__()
        self.buckets = nn.Linear(patch_width(sizes), 2 * sizes.seq - 1)

    def forward(self, patches):
        rel = self.buckets(patches)  # [N, L, 2L - 1]
        N, L, _ = rel.shape
        positions = torch.arange(L)[None].repeat(N, 1)
        relative = positions.unsqueeze(-1).repeat(1, 1, L) - positions.unsqueeze(1) + L - 1
        return torch.gather(rel, dim=2, index=relative)  # [N, L, L]


@SETTING
def test_an_index_that_varies_along_the_gathered_axis_is_clean(sizes):
    found = findings(RelativeBuckets(sizes), patches(sizes))
    assert found == [], messages(found)
