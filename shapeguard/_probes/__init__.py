"""Semantic probes: properties every correct attention module has, checked by running it.

Each probe changes the inputs (or the weights) in a way that must leave some part
of the output unchanged (or permuted), runs the module, and measures how far the
output moved, relative to the output's scale, on real tokens only. The inputs'
roles (token ids, data, padding masks and their polarity, which sequence each token
axis is) come from the trace's axis provenance (`layout`); a probe that cannot tell
those axes apart, or does not apply to the module, says so and is skipped.

- batch independence: changing one example leaves the others' outputs alone;
- sub-batch consistency: the first examples run alone give the same outputs;
- causality (causal modules): changing later tokens leaves earlier outputs alone;
- key-padding invariance: changing padded keys leaves the real tokens' outputs alone;
- token-permutation equivariance (no positional terms, no mask);
- node-relabelling equivariance (graphs: an edge list or an adjacency): relabelling the
  nodes permutes the node-indexed outputs alike, reordering the edges changes nothing;
- head-permutation invariance: permuting heads in the Q/K/V projections' rows and
  the output projection's columns leaves the output unchanged;
- length change: the module runs at a shorter length, and a causal module's first
  t outputs are the outputs of the first t tokens alone;
- decode consistency (causal modules with a cache): a prefill then one token at a time
  with the module's own cache gives the outputs of one forward (`decode`);
- reach: which inputs move which outputs, measured by autograd (or perturbation) and
  checked cell by cell against the intent the probes above establish (`reach`, with
  `reach_measure` and `reach_record`).

Everything here runs on a private copy of the module, in float64 when it can.

A probe passes, fails only with a counterexample (an edited input the unmodified
module runs, outputs moved beyond tolerance where the property says they must not), or
is inconclusive with its reason (docs/check.md); a probe with nothing to act on is not
applicable.

The framework: `result` (ProbeResult and its outcomes), `report` (CheckReport), `tree`
and `layout` (the inputs and outputs and their axes, from provenance), `masks` (how the
trace applied each mask), `intent` (declared causality, sharded state), `edits`
(changed inputs), `compare` (deviation and tolerance), `watch` (what the trace saw),
`subject` (the module under probe), `runs` (one RNG state per run, a module's refusal
told from a probe's crash), `steady` (state passed in, a forward that is not
deterministic or draws from the RNG), `liveness` (whether the outputs depend on the
attention at all) and `locate` (the op where a difference first appears). The probes:
`batch`, `sequence` (with `position_terms`, which tells a position term from a token
mixing bug), `decode`, and `heads` (with `head_groups`, which finds the head blocks to
permute, and `head_bias`, which tells when permuting heads is no symmetry).
"""

from .batch import batch_independence, sub_batch
from .compare import DtypeScan, rtol_for, tolerance
from .decode import decode_consistency
from .edits import take_examples
from .graph_nodes import node_relabelling
from .heads import head_permutation
from .layout import read_layout
from .reach import measured_reach
from .result import ProbeResult, inconclusive, not_applicable, skipped
from .sequence import causality, key_padding, length_change, token_permutation
from .subject import Subject, declared_sizes
from .tree import first_output, leaves, pick, rebuild
from .watch import Watch

__all__ = [
    "DtypeScan",
    "ProbeResult",
    "Subject",
    "Watch",
    "batch_independence",
    "causality",
    "declared_sizes",
    "decode_consistency",
    "first_output",
    "head_permutation",
    "inconclusive",
    "key_padding",
    "leaves",
    "length_change",
    "node_relabelling",
    "not_applicable",
    "measured_reach",
    "pick",
    "read_layout",
    "rebuild",
    "rtol_for",
    "skipped",
    "sub_batch",
    "take_examples",
    "token_permutation",
    "tolerance",
]
