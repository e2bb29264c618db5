"""The reach checked against the intent that can be established (padding, causality,
windows, documents): the seam every attention site calls after its reach is read.

Each invariant holds for every correct model, and is judged only where its intent is
established (`intent.of_site`); elsewhere nothing is claimed and the reach is recorded
and shown only. One bug gives one finding: a site reports the first invariant it breaks,
in the order below, with the flagged cells in `Reach.marks` and the padding the intent
says in `Reach.padding`.

- `reach_padded_key`: a real query sees a padded key;
- `reach_no_key`: a real query sees no key, where `mask_fully_masked` (which reads the
  mask alone) cannot tell it is real: it already reports rows whose own key other
  queries see, and examples that see nothing at all;
- `reach_documents`: a real query sees a real key of another packed document;
- `reach_future`: in a causal model (its attention module says `is_causal = True`), a
  real query sees a later real position of its own sequence; no claim where the model
  takes inputs that open spans on purpose (Gemma 3's image tokens, PaliGemma's prefix);
- `reach_window`: a causal windowed layer sees other past keys than its window of `W`
  (its own position and the `W - 1` before it; keys every later query sees, attention
  sinks, excepted), or a layer the config calls full attention sees a window;
- `reach_decode`: at a cached step of a causal model (its keys are cached keys joined
  with the step's own: `steps.own_at_step`), a real query does not see what the full
  forward's query at its position sees: its own key, no later slot, and, where the
  layer states its window or full attention, exactly its window's or every earlier real
  key. It stands for `reach_future` and `reach_window` there: the cause is the step's
  positions, not the mask's pattern. Not for `reach_padded_key`: a step that sees its
  padding is that finding, as the full forward's query would be, since its fix is the
  padding mask's (applied on the key axis, its cached columns included), not the step's
  positions; and its evidence, the root's padding mask, holds without the cache's layout.
"""

import dataclasses
from collections.abc import Iterator
from math import prod

from .._errors import Violation
from . import intent as _intent
from .rows import Reach, Runs, runs_text, runs_where

_MARKED = 64  # cells kept in `Reach.marks` per site, at most


@dataclasses.dataclass
class _Found:
    """One invariant's broken rows at a site: how many, the first, and the cells."""

    kind: str
    rows: int = 0
    first: tuple[tuple[int, ...], int, Runs] | None = None
    marks: list = dataclasses.field(default_factory=list)

    def add(self, index: tuple[int, ...], query: int, runs: Runs, weight: int) -> None:
        self.rows += weight
        if self.first is None:
            self.first = (index, query, runs)
        if len(self.marks) < _MARKED:
            self.marks.append((index, query, runs))


def judge(call, reach: Reach) -> tuple[Reach, list[Violation]]:
    """`reach` with the intent's padding and the flagged cells filled in, and the
    findings of the invariants at the site `call` is (SDPA, nn.MultiheadAttention, the
    softmax over masked scores, flash-attn, FlexAttention). No intent: (reach, [])."""
    site = _intent.of_site(call, reach)
    if site is None:
        return reach, []
    found, total = check(reach, site)
    padding: tuple[Runs, ...] = ()
    if site.padding is not None:
        padding = tuple(runs_where(row) for row in site.padding.keys)
    if found is None:
        return dataclasses.replace(reach, padding=padding), []
    judged = dataclasses.replace(reach, padding=padding, marks=tuple(found.marks))
    return judged, [_violation(call, reach, site, found, total)]


def check(reach: Reach, site: "_intent.SiteIntent") -> tuple[_Found | None, int]:
    """The first invariant the reach breaks (None: none), and the real query rows read."""
    found = {
        kind: _Found(kind)
        for kind in (
            "reach_padded_key", "reach_no_key", "reach_documents", "reach_decode", "reach_future"
        )
    }  # fmt: skip
    window = _Found("reach_window")
    total = 0
    for index, example, weight in _examples(reach, site):
        pads = _row(site.padding.keys, example) if site.padding is not None else None
        docs = _row(site.documents, example) if site.documents is not None else None
        seen_own = _seen_keys(reach, index) if site.own is not None else set()
        rows = {q: reach.row(index, q) for q in reach.kept_queries}
        real_rows = {q: r for q, r in rows.items() if _real(site, example, q, pads)}
        total += len(real_rows) * weight
        if not any(rows.values()):
            continue  # an example that sees nothing: mask_fully_masked says it
        sinks = _sinks(site, real_rows, pads, reach.seq_k)
        for q, runs in real_rows.items():
            own = site.own[q] if site.own is not None else -1
            keys = _keys(runs)
            if pads is not None:
                padded = [k for k in keys if pads[k]]
                if padded:
                    found["reach_padded_key"].add(index, q, _intent.runs_of_keys(padded), weight)
                    continue
            if not keys:
                if pads is not None and (own < 0 or own not in seen_own):
                    found["reach_no_key"].add(index, q, (), weight)
                continue
            if own < 0:
                continue
            if docs is not None:
                other = [k for k in keys if docs[k] != docs[own]]
                if other:
                    found["reach_documents"].add(index, q, _intent.runs_of_keys(other), weight)
                    continue
            if not site.causal:
                continue
            if site.step:
                wrong = [] if site.bidirectional else _step_cells(site, own, keys, pads, sinks)
                if wrong:
                    found["reach_decode"].add(index, q, _intent.runs_of_keys(wrong), weight)
                continue
            if not site.bidirectional:
                later = [k for k in keys if k > own]
                if later:
                    found["reach_future"].add(index, q, _intent.runs_of_keys(later), weight)
                    continue
            bad = _window_cells(site, own, keys, pads, docs, sinks)
            if bad:
                window.add(index, q, _intent.runs_of_keys(bad), weight)
    for one in (*found.values(), window):
        if one.rows:
            return one, total
    return None, total


def _examples(reach: Reach, site) -> Iterator[tuple[tuple[int, ...], int, int]]:
    """(leading index, example, how many slices of the scores it stands for) of every
    stored slice, and every example of a batch axis stored once where the padding or the
    documents differ by example."""
    axis = site.batch_axis
    per_example = axis is not None and reach.stored[axis] == 1
    weight = prod(
        size
        for a, (size, kept) in enumerate(zip(reach.lead, reach.stored, strict=True))
        if kept == 1 and not (per_example and a == axis)
    )
    for index in reach.slices():
        if axis is None:
            yield index, 0, weight
        elif per_example:
            for b in range(reach.lead[axis]):
                yield (*index[:axis], b, *index[axis + 1 :]), b, weight
        else:
            yield index, index[axis], weight


def _row(rows, example: int):
    return rows[example] if len(rows) > 1 else rows[0]


def _real(site, example: int, query: int, pads) -> bool:
    """Whether the query is a real token: not padding by the intent. Where the queries'
    padding is not known (cross-attention), every query counts as real."""
    padding = site.padding
    if padding is not None and padding.queries is not None:
        return not _row(padding.queries, example)[query]
    if site.own is not None and pads is not None:
        own = site.own[query]
        return own < 0 or not pads[own]
    return True


def _keys(runs: Runs) -> list[int]:
    return [k for a, b in runs for k in range(a, b)]


def _seen_keys(reach: Reach, index: tuple[int, ...]) -> set[int]:
    seen: set[int] = set()
    for q in reach.kept_queries:
        seen.update(_keys(reach.row(index, q)))
    return seen


def _sinks(site, real_rows: dict, pads, seq_k: int) -> set[int]:
    """Keys every later real query sees, far from the end (attention sinks, global
    tokens): excepted from the window where they are a strict part of the far keys; a
    layer with no window at all has every far key so, and is not excused."""
    if site.window is None or site.own is None:
        return set()
    far = [k for k in range(seq_k - site.window) if pads is None or not pads[k]]
    seen = {q: set(_keys(r)) for q, r in real_rows.items()}
    sinks = {k for k in far if all(k in keys for q, keys in seen.items() if site.own[q] >= k)}
    return sinks if len(sinks) < len(far) else set()


def _step_cells(site, own: int, keys: list[int], pads, sinks) -> list[int]:
    """The keys where a cached step's query differs from the full forward's query at its
    position: real keys it should see and does not, and keys it sees that it should not
    (later slots, keys beyond its window that are no sinks)."""
    seen = set(keys)
    later = {k for k in seen if k > own}
    if site.window is None and not site.full:
        # No stated window and no stated full layer: the earlier keys a query misses may be
        # a window the model does not state (Mistral's config), so only its own key, which
        # every causal query sees, and the later slots are judged.
        return sorted(later | ({own} - seen))
    start = max(own - site.window + 1, 0) if site.window is not None else 0
    wanted = {k for k in range(start, own + 1) if pads is None or not pads[k]}
    extra = {k for k in seen - wanted if not (k < start and k in sinks)}
    return sorted(extra | (wanted - seen))


def _window_cells(site, own: int, keys: list[int], pads, docs, sinks) -> list[int]:
    """The past keys a causal query sees that its window does not hold, or (a window
    missing) the real keys of its window it does not see."""
    if site.window is not None:
        start = own - site.window + 1
        beyond = [k for k in keys if k < start and k not in sinks]
        if beyond:
            return beyond
        if docs is not None:
            return []
        seen = set(keys)
        return [
            k
            for k in range(max(start, 0), own + 1)
            if k not in seen and (pads is None or not pads[k])
        ]
    if site.full and docs is None:
        seen = set(keys)
        return [k for k in range(own + 1) if k not in seen and (pads is None or not pads[k])]
    return []


# -- the message ---------------------------------------------------------------------------
def _violation(call, reach: Reach, site, found: _Found, total: int) -> Violation:
    index, query, runs = found.first or ((), 0, ())
    shape = shape_text(reach)
    at = _at(reach, index, query)
    own = site.own[query] if site.own is not None else -1
    if found.kind == "reach_padded_key":
        relation = (
            f"{found.rows} of {total} real query rows see padded keys (first at {at}: "
            f"it sees padded {runs_text(runs)}); padding from {site.padding.evidence}"
        )
        hint = (
            "hide the padded keys from every query: apply the padding mask on the key axis "
            "([batch, 1, 1, seq_k]) in every layer and head, with the polarity the op reads "
            "(SDPA's bool attn_mask keeps True, masked_fill hides True, an additive mask is "
            "very negative where hidden)"
        )
    elif found.kind == "reach_no_key":
        relation = (
            f"{found.rows} of {total} real query rows see no key (first at {at}); the query "
            f"is a real token by {site.padding.evidence if site.padding else 'its position'}"
        )
        hint = (
            "each real query must see at least one key: the mask hides this query's real "
            "keys too; check its polarity and that padding is hidden on the key axis only"
        )
    elif found.kind == "reach_documents":
        relation = (
            f"{found.rows} of {total} real query rows see keys of other packed documents "
            f"(first at {at}: it sees {runs_text(runs)} of another document); documents from "
            f"{site.documents_evidence}"
        )
        hint = (
            "packed documents must not see each other: mask with a block-diagonal mask built "
            "from the document boundaries (key document == query document, and causal), or "
            "pass cu_seqlens to a varlen kernel"
        )
    elif found.kind == "reach_future":
        relation = (
            f"{found.rows} of {total} real query rows see later positions (first at {at}, "
            f"position {own}: it sees {runs_text(runs)}); the site is causal: {site.causal}"
        )
        hint = (
            "a causal model's query sees only its own and earlier positions: apply the causal "
            "mask (keys <= query, bottom-right aligned with a cache: query i is at past + i), "
            "or is_causal=True with seq_q == seq_k"
        )
    elif found.kind == "reach_decode":
        relation, hint = _step_text(reach, site, found, total, at, own, runs)
    else:
        relation, hint = _window_text(site, found, total, at, own, runs)
    return Violation(
        found.kind,
        f"{reach.op or call.op} over {shape}: {relation}",
        operands(call),
        hint,
        severity="warning",
    )


def _window_text(site, found: _Found, total: int, at: str, own: int, runs: Runs):
    if site.window is not None:
        w = site.window
        first = max(own - w + 1, 0)
        relation = (
            f"{found.rows} of {total} real query rows do not see exactly their window of "
            f"{w} keys (first at {at}, position {own}: its window is keys {first}..{own}, "
            f"it differs at {runs_text(runs)}); {site.window_evidence}"
        )
        hint = (
            f"a sliding-window layer's query i sees keys i-{w - 1}..i (kv > q - {w} and "
            f"kv <= q); check the window's size and its off-by-one, and that this layer's "
            f"index selects the windowed mask"
        )
    else:
        relation = (
            f"{found.rows} of {total} real query rows of a full-attention layer miss earlier "
            f"keys (first at {at}, position {own}: it does not see {runs_text(runs)}); "
            f"{site.full}"
        )
        hint = (
            "layers follow the config's layer_types: a full_attention layer sees every earlier "
            "key; check that the layer index picks the full mask, not the sliding-window one"
        )
    return relation, hint


def _step_text(reach: Reach, site, found: _Found, total: int, at: str, own: int, runs: Runs):
    w = site.window
    first = max(own - w + 1, 0) if w is not None else 0
    if w is not None:
        wanted = f"keys {first}..{own} (its window of {w})"
    elif site.full:
        wanted = f"keys 0..{own} ({site.full})"
    else:  # no stated window: which earlier keys it sees is not judged
        wanted = f"key {own} and no later one"
    seen = runs_text(reach.row(*found.first[:2])) if found.first else "no key"
    relation = (
        f"{found.rows} of {total} real query rows of a cached step do not see the keys the "
        f"full forward's query at their position sees (first at {at}: its own key is "
        f"{own}, so it should see {wanted}; it sees {seen}, wrong at {runs_text(runs)}); "
        f"{site.step}; the site is causal: {site.causal}"
        + (f"; {site.window_evidence}" if w is not None else "")
    )
    flagged = _keys(runs)
    if any(k > own for k in flagged):
        cause = (
            "it sees slots past its own key: a stale or zeroed cache slot beyond the written "
            "length, or a mask not cut to cached + new keys"
        )
    elif own in flagged:
        cause = (
            "it does not see its own key: the step's positions restart at 0 (or lag the "
            "cache), or the mask does not cover the new tokens"
        )
    else:
        cause = "it misses earlier keys: the mask does not cover the whole cache"
    hint = (
        f"{cause}; a cached step's query i is at position past + i (transformers: "
        "cache_position = past + arange(new), position_ids offset by the cache length) and "
        "sees every cached key and its own, only its window's in a windowed layer"
    )
    return relation, hint


def shape_text(reach: Reach) -> str:
    """`[batch=3, 4, seq_q=7, seq_k=5]`: the site's shape, its leading axes named where
    provenance names them."""
    names = list(reach.lead_axes) if len(reach.lead_axes) == len(reach.lead) else []
    parts = [
        f"{names[i]}={size}" if i < len(names) and names[i] else str(size)
        for i, size in enumerate(reach.lead)
    ]
    return f"[{', '.join([*parts, f'seq_q={reach.seq_q}', f'seq_k={reach.seq_k}'])}]"


def _at(reach: Reach, index: tuple[int, ...], query: int) -> str:
    """`batch 1, heads 0, query 2` where provenance names the leading axes, else the
    leading index as a tuple (`slice (1, 0), query 2`)."""
    names = list(reach.lead_axes) if len(reach.lead_axes) == len(reach.lead) else []
    shown = [i for i, size in enumerate(reach.lead) if size > 1]
    if all(i < len(names) and names[i] for i in shown):
        parts = [f"{names[i]} {index[i]}" for i in shown]
    else:
        parts = [f"slice {tuple(index)}"]
    return ", ".join([*parts, f"query {query}"])


def operands(call) -> tuple:
    """The site's operands for a reach finding: the scores at a softmax, else the kernel's
    query, key and mask."""
    bound = call.bound()
    names = ("input",) if call.spec in _intent.SOFTMAXES else ("query", "key", "attn_mask")
    found = []
    for name in names:
        tensor = bound.get(name)
        if hasattr(tensor, "shape"):
            default = "scores" if name == "input" else name
            found.append(call.operand(call.label_of(tensor, default), tensor))
    return tuple(found)
