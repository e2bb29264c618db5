"""Why permuting heads is not a symmetry of a module: a bias on the scores per head.

T5's and MPNet's relative-position buckets, MPT's and BLOOM's ALiBi slopes add a term
to the scores that differs from head to head, and lives outside the Q/K/V and output
projections the head-permutation probe permutes: with the heads permuted, each head
gets another head's bias, and the output changes although the module is correct.
"""


def per_head_bias(events) -> str:
    """Where a term that varies along the heads is added to the scores, or ""."""
    from .. import _ops
    from .watch import describe_event

    adds = set(_ops.by_name("add").spellings) | {"baddbmm"}
    for event in events:
        if event.op == "scaled_dot_product_attention" and len(event.inputs) >= 4:
            q, mask = event.inputs[0], event.inputs[3]
            if (
                len(q.shape) >= 3
                and len(mask.shape) >= 3
                and mask.dtype != "bool"
                and mask.shape[-3] == q.shape[-3] > 1
            ):
                return describe_event(event)  # a float attn_mask per head: T5's bias
            continue
        if event.op == "baddbmm" and len(event.inputs) >= 3 and event.outputs:
            bias, out = event.inputs[0], event.outputs[0]
            if len(bias.shape) == 3 and len(out.shape) == 3 and bias.shape[0] == out.shape[0] > 1:
                return describe_event(event)  # BLOOM's ALiBi per [batch * heads]
            continue
        if event.op not in adds or len(event.inputs) < 2:
            continue
        scores = next((r for r in event.inputs if r.role == "scores"), None)
        if scores is None or len(scores.shape) < 3:
            continue
        heads = scores.shape[-3]
        if heads < 2:
            continue
        for other in event.inputs:
            if other is scores or other.role == "mask" or len(other.shape) < 3:
                continue
            if other.shape[-3] == heads and other.dtype not in ("bool",):
                return describe_event(event)
    return ""
