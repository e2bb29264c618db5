"""Head-count checks on a module's configuration: d_model % n_heads, GQA n_heads % n_kv_heads."""

from .._errors import Violation
from .._names import axes as _axes
from . import ERROR, declare

# Raised by guard at construction and by the session when a module is first entered.
declare("config", {"head_divisibility": ERROR, "gqa_divisibility": ERROR})


def head_counts_that_work(d_model: int, limit: int = 12) -> str:
    counts = [d for d in _axes.divisors(d_model) if d <= 256][:limit]
    return ", ".join(str(c) for c in counts)


def divisibility_violation(
    d_attr: str, d_model: int, h_attr: str, heads: int, where: str = ""
) -> Violation:
    remainder = d_model % heads
    return Violation(
        "head_divisibility",
        f"{d_attr}={d_model} is not divisible by {h_attr}={heads} "
        f"({d_model} = {heads} * {d_model // heads} + {remainder}){where}",
        (),
        f"head counts that work for {d_attr}={d_model}: {head_counts_that_work(d_model)}; "
        f"or pick {d_attr} as a multiple of {h_attr} (e.g. {heads * max(1, round(d_model / heads))})",
    )


def check_sizes(sizes: dict[str, tuple[str, int]], where: str = ""):
    """Yield violations for declared sizes {axis: (attribute, size)}."""
    if "d_model" in sizes and "heads" in sizes:
        (d_attr, d_model), (h_attr, heads) = sizes["d_model"], sizes["heads"]
        explicit_dk = sizes.get("d_k")
        # A head_dim chosen on purpose (heads * head_dim != d_model, as some LLMs do) is
        # legal; d_k = d_model // n_heads that silently rounds down is the classic trap.
        if d_model % heads and (explicit_dk is None or explicit_dk[1] == d_model // heads):
            yield divisibility_violation(d_attr, d_model, h_attr, heads, where)
    if "heads" in sizes and "kv_heads" in sizes:
        (h_attr, heads), (kv_attr, kv_heads) = sizes["heads"], sizes["kv_heads"]
        if heads % kv_heads:
            groups = [d for d in _axes.divisors(heads)]
            yield Violation(
                "gqa_divisibility",
                f"{h_attr}={heads} is not divisible by {kv_attr}={kv_heads}{where}: "
                "grouped-query attention shares each kv head among a whole number of query heads",
                (),
                f"kv head counts that work for {h_attr}={heads}: {', '.join(map(str, groups))}",
            )


def check_module(module, path: str = ""):
    """Config violations of one module, read from its attributes (and `module.config`)."""
    where = f" in {path} ({type(module).__name__})" if path else f" in {type(module).__name__}"
    yield from check_sizes(_axes.declared_sizes(module), where)


def check_tree(root):
    """Config violations of every module under `root`."""
    for path, module in root.named_modules():
        yield from check_module(module, path)
