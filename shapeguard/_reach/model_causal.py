"""Causal intent from the model around an attention site, where its module does not
declare `is_causal` itself: its config's flags, and a triangle at a sibling site.

- A config's `is_decoder` or `is_causal` (transformers configs), unless the config says
  that some of its attention sites are cross-attention (`is_encoder_decoder`,
  `add_cross_attention`): its flag then says nothing about which site is which.
- A sibling: another site of the same module class at the same place of the same list of
  layers (`model.layers.0.attn` and `model.layers.3.attn`, both `Block`), earlier in
  this forward, whose queries see no later position although later keys were there (its
  reach is a triangle). Only a site whose keys are tied to its queries by provenance is
  read, and the sites are kept per forward (on `RootInputs.read`), so an encoder's and a
  decoder's layers (other places, other lists), cross-attention, a decode step (no later
  key to hide) and another forward are never evidence. A module that says
  `is_causal = False` is never judged by either (an encoder's or a cross-attention).

Whatever a model with bidirectional spans does on purpose (Gemma 3's image tokens,
PaliGemma's prefix) is excused by the judge where the inputs say so
(`SiteIntent.bidirectional`); a prefix-LM whose every layer sees its prefix has no
triangle anywhere, so no sibling is evidence.
"""

import re

_INDEX = re.compile(r"\.\d+(?=\.|$)")
_SITES = ("model_causal", "sites")  # the key of this forward's causal sites on RootInputs


def evidence(call, module, inputs, reach, own: tuple[int, ...] | list[int]) -> str:
    """Evidence that the site is causal from its config or a sibling ("" where none), and
    this site noted for its later siblings when its reach is a triangle."""
    if module is None or getattr(module, "is_causal", None) is not None:
        _note(call, module, inputs, reach, own)
        return ""
    found = _config(module) or _sibling(call, module, inputs)
    _note(call, module, inputs, reach, own)
    return found


def _config(module) -> str:
    config = getattr(module, "config", None)
    if config is None:
        return ""
    if getattr(config, "is_encoder_decoder", False) is True:
        return ""
    if getattr(config, "add_cross_attention", False) is True:
        return ""
    for flag in ("is_decoder", "is_causal"):
        if getattr(config, flag, None) is True:
            return f"{type(config).__name__}.{flag} is True (on {type(module).__name__}.config)"
    return ""


def _place(call, module) -> tuple[str, str] | None:
    """(the module's class, its path with each list index as `*`), or None where it is not
    an element of a list of layers."""
    path = call.module_path(module) or ""
    pattern = _INDEX.sub(".*", path)
    if pattern == path:
        return None
    return type(module).__qualname__, pattern


def _sibling(call, module, inputs) -> str:
    place = _place(call, module)
    if place is None or inputs is None:
        return ""
    seen = inputs.read.get(_SITES, {})
    other = seen.get(place)
    if other is None:
        return ""
    return (
        f"{other}, another {place[0]} at {place[1]} in this forward, sees no later position "
        "(its reach is causal)"
    )


def _note(call, module, inputs, reach, own) -> None:
    """Keep this site's path on the forward's record where its reach is a triangle."""
    if module is None or inputs is None:
        return
    place = _place(call, module)
    if place is None or not is_triangle(reach, own):
        return
    seen = inputs.read.setdefault(_SITES, {})
    seen.setdefault(place, call.module_path(module))


def is_triangle(reach, own) -> bool:
    """Whether no query sees a later position than its own, in every slice, while some
    query had later keys to hide (a decode step's last query has none: no evidence)."""
    kept = reach.kept_queries
    if not any(0 <= own[q] < reach.seq_k - 1 for q in kept):
        return False
    seen = False
    for index in reach.slices():
        for q in kept:
            at = own[q]
            runs = reach.row(index, q)
            if at < 0 or not runs:
                continue
            if runs[-1][1] - 1 > at:
                return False
            seen = True
    return seen
