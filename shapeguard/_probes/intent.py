"""What a module says of itself that a probe needs: causal by design, sharded state.

Causal intent comes, strongest first, from `check(causal=...)`, from what the trace
saw (SDPA's `is_causal=True`, a triangular mask or one near the diagonal, `watch.py`),
and from the module's own declaration: an attention layer with `is_causal = True`
(transformers' decoder layers), or a transformers config with `is_decoder`.
"""


def declared_causal(model) -> str:
    """Why the module is causal by its own declaration, or ""."""
    for name, module in model.named_modules():
        if getattr(module, "is_causal", None) is True:
            where = f"{name} ({type(module).__name__})" if name else type(module).__name__
            return f"{where} sets is_causal=True"
    config = getattr(model, "config", None)
    if getattr(config, "is_decoder", False) is True:
        return f"{type(config).__name__}.is_decoder"
    return ""


def causal_elsewhere(layout, watch) -> str:
    """Why the causal evidence is not about the queries the probes test (group 0): every
    causal mask (or is_causal) was over other queries, and a mask over these was not
    causal (an encoder-decoder whose outputs keep the encoder's tokens); "" otherwise."""
    if not layout.roots or not watch.causal_queries:
        return ""
    queries = layout.roots[0].find()
    if any(r.find() is queries for r in watch.causal_queries):
        return ""
    if not any(r.find() is queries for r in watch.open_queries):
        return ""  # nothing says how the attention over these queries is masked
    return (
        f"the attention over {layout.group_names[0]} is not causal: its mask is not, and the "
        f"causal one ({watch.causal}) is over other queries"
    )


def sharded(model, inputs) -> str:
    """Why the module's weights, state or inputs are DTensors (sharded), or ""."""
    from .tree import leaves

    for kind, items in (
        ("parameter", model.named_parameters()),
        ("buffer", model.named_buffers()),
    ):
        for name, value in items:
            if _is_dtensor(value):
                return f"its {kind} {name} is a DTensor{_placement(value)}"
    for path, t in leaves(inputs):
        if _is_dtensor(t):
            label = ".".join(map(str, path[1:])) or "an input"
            return f"the input {label} is a DTensor{_placement(t)}"
    return ""


def _is_dtensor(t) -> bool:
    return any(c.__name__ == "DTensor" for c in type(t).__mro__)


def _placement(t) -> str:
    placements = getattr(t, "placements", None)
    return f" ({', '.join(map(str, placements))})" if placements else ""
