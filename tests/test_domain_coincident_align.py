"""Axes lined up by identity where their sizes coincide (issue 32): the domain zoo's three bugs
that torch rejects where sizes differ and runs where batch == tokens == latents, found at the
coincident size by `misaligned_axes` (checks/alignment.py), and the code that must stay silent
at the three size settings."""

import warnings

import domain_zoo
import domain_zoo_measure as measuring
import pytest
import torch
from domain_zoo_sizes import COINCIDENT, SETTINGS
from torch import nn

import shapeguard
from shapeguard import ShapeWarning

pytestmark = pytest.mark.no_shapeguard  # the bugs warn on purpose
SETTING = pytest.mark.parametrize("sizes", SETTINGS, ids=lambda s: s.name)


def findings(module, *inputs) -> list:
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", ShapeWarning)
        trace = shapeguard.trace(module, *inputs, mode="warn")
    return list(trace.findings)


def zoo_findings(arch: str, sizes, bug: str | None) -> list:
    return findings(*_built(arch, sizes, bug))


def _built(arch, sizes, bug):
    module, inputs = measuring.build(domain_zoo.ARCHS[arch], sizes, bug)
    return (module, *inputs)


def only(found, kind: str):
    assert [f.kind for f in found] == [kind], [str(f) for f in found]
    return found[0]


# -- the three bugs at the coincident size -----------------------------------------------
def test_perceiver_latents_paired_with_the_batch_names_the_parameter_and_the_batch():
    found = only(zoo_findings("perceiver", COINCIDENT, "perceiver_latents_axis"), "misaligned_axes")
    assert found.message.splitlines()[0] == (
        "einsum 'b h i d, b h j d -> b h i j': 'b' pairs q's axis 0 (axis 0 of latents, a "
        "parameter's own axis) with k.batch (axis 0), while q holds the copy made along "
        "k.batch on axis 2 ('i')"
    )
    assert domain_zoo.on_marked_line("perceiver_latents_axis", found.location)
    assert found.hint == (
        "a parameter holds no examples: make the copy along k.batch the axis of q under 'b', "
        "and keep the parameter's own axis under 'i'"
    )


def test_detr_batch_first_memory_names_the_queries_rows_and_the_positions():
    found = only(zoo_findings("detr", COINCIDENT, "detr_batch_first"), "misaligned_axes")
    lines = found.message.splitlines()
    assert lines[0] == (
        "MultiheadAttention (batch_first=False): the batch axis of query is a parameter's own "
        "axis (axis 0 of query_embed.weight), key's is key.height*width: a parameter holds no "
        "examples"
    )
    assert domain_zoo.on_marked_line("detr_batch_first", found.location)
    assert "  key    [batch=4, height*width=4, channels=16] float32" in lines
    assert found.hint.startswith(
        "batch_first=False reads inputs as [seq, batch, embed_dim]: copy the parameter along "
        "the batch on axis 1 (e.g. weight.unsqueeze(1).repeat(1, B, 1))"
    )


# -- silent counterparts -----------------------------------------------------------------
@SETTING
@pytest.mark.parametrize("arch", ["dit", "perceiver", "detr"])
def test_the_correct_architectures_are_clean(arch, sizes):
    assert zoo_findings(arch, sizes, None) == []


class PerToken(nn.Module):
    """A conv patch embedding scaled per token by a table the caller passes in, and a learned
    position table added: an input's or a parameter's axis lined up with the tokens is no
    batch, and nothing establishes the caller's table as one."""

    def __init__(self, channels, d_model, patch, tokens):
        super().__init__()
        self.embed = nn.Conv1d(channels, d_model, patch, stride=patch)
        self.pos = nn.Parameter(torch.randn(tokens, d_model))

    def forward(self, signal, weights):
        x = self.embed(signal).transpose(1, 2)  # [B, tokens, d_model]
        return (x + self.pos) * weights.unsqueeze(0)  # weights: [tokens, d_model]


@SETTING
def test_tables_lined_up_with_the_tokens_are_clean(sizes):
    B, tokens, d = sizes.batch, sizes.batch, sizes.d_model  # tokens == batch at every size
    module = PerToken(sizes.in_channels, d, sizes.patch, tokens)
    signal = torch.randn(B, sizes.in_channels, tokens * sizes.patch)
    assert findings(module, signal, torch.randn(tokens, d)) == []


class SharedLatents(nn.Module):
    """Learned latents attending among themselves in groups (no batch at all): one parameter
    on both sides of every letter, so no letter pairs it with another axis."""

    def __init__(self, groups, d_model, heads):
        super().__init__()
        self.latents = nn.Parameter(torch.randn(groups, groups, d_model))
        self.attn = nn.MultiheadAttention(d_model, heads)

    def forward(self, x):
        out = self.attn(self.latents, self.latents, self.latents, need_weights=False)[0]
        return x + out.mean()


@SETTING
def test_a_parameter_attending_to_itself_is_clean(sizes):
    module = SharedLatents(sizes.batch, sizes.d_model, sizes.heads)
    assert findings(module, torch.randn(sizes.batch, sizes.seq, sizes.d_model)) == []
