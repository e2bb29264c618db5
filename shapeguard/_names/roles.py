"""Canonical roles (Q, K, V, scores, attn, mask, context, out) from the names users pick."""

import functools
import re

ROLES = ("Q", "K", "V", "scores", "attn", "mask", "context", "out")

# Whole-word patterns on the lower-cased name, tried in order. Ambiguous names
# such as nanoGPT's `att` (scores first, then weights) are left to data flow.
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (role, re.compile(pattern))
    for role, pattern in (
        ("mask", r"(^|_)mask(s|ed)?($|_)|^(bias|causal|padding|pad)$"),
        ("scores", r"score|logit|^qk$|^dots?$|^sim$|^energy$"),
        (
            "attn",
            r"^(attn|attention|p_attn|probs?|attn_probs|attn_weights|attention_probs|weights|alpha|a)$",
        ),
        ("context", r"^(context|ctx|context_layer|attn_output|attn_out|heads_out)$"),
        ("out", r"^(out|output|outputs|o|result|y_out)$"),
        ("Q", r"^(q|query|queries|xq|q_s|q_proj|q_states|query_states|query_layer)$|^q_?\d+$"),
        ("K", r"^(k|key|keys|xk|k_s|k_proj|k_states|key_states|key_layer)$|^k_?\d+$"),
        ("V", r"^(v|value|values|xv|v_s|v_proj|v_states|value_states|value_layer)$|^v_?\d+$"),
    )
)


_LEADING_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9.]*")


@functools.lru_cache(maxsize=4096)
def canonical_role(label: str | None) -> str | None:
    """`Q` for `query_states`, `mask` for `attn_mask`, None when the name says nothing.

    >>> canonical_role("query_states"), canonical_role("attn_mask"), canonical_role("h")
    ('Q', 'mask', None)
    """
    if not label:
        return None
    match = _LEADING_NAME.match(label.strip().removeprefix("self."))
    if match is None:
        return None
    # `self.bias[:, :, :T, :T] == 0` is named by `bias`; `x.attn.weights` by `weights`.
    name = match.group(0).rsplit(".", 1)[-1].lower()
    for role, pattern in _PATTERNS:
        if pattern.search(name):
            return role
    return None
