"""The attention flow of a trace: events grouped into blocks, and each block into stages.

A stage is one step of the attention math, in the order the HTML diagram draws
them: x -> Q/K/V projection -> head split -> scores -> mask -> softmax ->
context -> merge -> out. Stages come from the roles the trace gave each tensor
(Q, K, V, scores, attn, context, out), so any attention code that names its
tensors, or whose data flow names them, gets the same picture. Pure Python:
works on a Trace loaded from anywhere, never on tensors.
"""

from dataclasses import dataclass, field

from .. import _ops
from .._trace.record import TensorRecord

# Rows of the diagram, top to bottom. A fused kernel (SDPA, flash-attn,
# nn.MultiheadAttention) stands in for the rows from scores to context.
ROWS = ("input", "proj", "split", "scores", "mask", "softmax", "context", "merge", "out")
FUSED_ROWS = ("scores", "mask", "softmax", "context")
COLUMNS = ("Q", "K", "V")

# Which ops feed which rows comes from the op table's `step` (and `family`), in every
# spelling an event may carry.
FUSED_OPS = _ops.spellings_where(step="fused")  # SDPA, flash-attn
# torch's composite modules, recorded as one event each (shapeguard/_trace/composites.py).
COMPOSITE_OPS = _ops.family_ops(_ops.COMPOSITE)
MHA_OPS = _ops.spellings_where(step="module")  # multi_head_attention_forward and those
_ANCHOR_ROLES = frozenset({"scores", "attn", "context"})
_MATMUL_OPS = _ops.spellings_where(step="product")
_MASK_OPS = _ops.spellings_where(step="mask")
_LINEAR_OPS = _ops.spellings_where(step="projection")

TITLES = {
    "input": "input",
    "proj": "projection",
    "split": "head split",
    "scores": "scores = Q K^T / sqrt(d_k)",
    "mask": "mask",
    "softmax": "softmax",
    "context": "context = attn V",
    "merge": "merge heads",
    "out": "output projection",
    "fused": "fused attention",
    "mha": "nn.MultiheadAttention",
}


@dataclass
class Node:
    """One box of the diagram: a stage, its column, and the tensor it made."""

    stage: str  # a ROWS entry, or "fused" / "mha"
    column: str = ""  # "Q", "K", "V", "QKV" or "" (centered)
    record: TensorRecord | None = None  # the TensorRecord shown, None for a failed op
    events: list = field(default_factory=list)  # the Events folded into this box
    extra: list = field(default_factory=list)  # (label, TensorRecord) shown under the main tensor
    findings: list[int] = field(default_factory=list)  # indices into trace.findings
    failed_op: str = ""  # set when the op raised before it could be recorded

    @property
    def ops(self) -> list[str]:
        seen: list[str] = []
        for event in self.events:
            if event.op not in seen:
                seen.append(event.op)
        return seen or ([self.failed_op] if self.failed_op else [])

    @property
    def title(self) -> str:
        if self.stage in ("proj", "split", "input") and self.column:
            return f"{TITLES[self.stage]} {self.column}" if self.stage != "input" else self.column
        if self.stage == "mha" and self.events and self.events[-1].op in COMPOSITE_OPS:
            return f"nn.{self.events[-1].op}"
        return TITLES.get(self.stage, self.stage)

    @property
    def location(self) -> str:
        return self.events[-1].location if self.events else ""

    def rows(self) -> tuple[str, ...]:
        return FUSED_ROWS if self.stage in ("fused", "mha") else (self.stage,)


@dataclass
class Block:
    """The nodes of one attention module (or of the whole trace when there is one)."""

    module: str  # module path, "" for the root
    module_type: str
    nodes: list[Node] = field(default_factory=list)
    same_as: list[str] = field(default_factory=list)  # later blocks with identical shapes

    @property
    def name(self) -> str:
        if self.module and self.module_type:
            return f"{self.module} ({self.module_type})"
        return self.module or self.module_type or "trace"

    def signature(self) -> tuple:
        # Inputs are named after what fed them (x, or the previous layer's output).
        return tuple(
            (
                n.stage,
                n.column if n.stage != "input" else "",
                tuple(n.record.shape) if n.record is not None else None,
            )
            for n in self.nodes
        )


def _is_anchor(event) -> bool:
    return event.op in FUSED_OPS or event.op in MHA_OPS or event.role in _ANCHOR_ROLES


def _block_paths(events) -> list[tuple[str, str]]:
    """(path, class) of each module that computes attention, in first-seen order."""
    found: dict[str, str] = {}
    for event in events:
        if _is_anchor(event) and event.module not in found:
            found[event.module] = event.module_type
    return list(found.items())


def _owner(module: str, paths: list[str]) -> str | None:
    best = None
    for path in paths:
        inside = path == "" or module == path or module.startswith(path + ".")
        if inside and (best is None or len(path) > len(best)):
            best = path
    return best


def _split_module(description: str) -> str:
    """The path in a finding's `"blocks.0.attn (MultiHeadAttention)"`; "" for the root."""
    if description.endswith(")") and " (" in description:
        return description.split(" (", 1)[0]
    return ""


class _Builder:
    """Folds a block's events, in order, into stage nodes."""

    def __init__(self, block: Block) -> None:
        self.block = block
        self.by_key: dict[tuple[str, str], Node] = {}
        self.seen_scores = False
        self.seen_context = False
        self.event_node: dict[int, Node] = {}

    def node(self, stage: str, column: str = "") -> Node:
        key = (stage, column)
        node = self.by_key.get(key)
        if node is None:
            node = Node(stage, column)
            self.by_key[key] = node
            self.block.nodes.append(node)
        return node

    def put(self, event, stage: str, column: str = "", record=None) -> None:
        node = self.node(stage, column)
        if not node.events or node.events[-1] is not event:
            node.events.append(event)
        record = record if record is not None else event.outputs[0]
        # `K.transpose(-2, -1)` on the scores line is part of the product, not of
        # the head split: the box keeps showing K as the heads made it.
        if node.record is None or not (record.label or "").endswith("^T"):
            node.record = record
        self.event_node[event.index] = node

    def add(self, event) -> None:
        out = event.outputs[0]
        role = out.role
        op = event.op
        if op in FUSED_OPS or op in MHA_OPS:
            if op in MHA_OPS or not any(n.stage == "split" for n in self.block.nodes):
                self._input(event, "")
            self.put(event, "fused" if op in FUSED_OPS else "mha")
            self.seen_scores = self.seen_context = True
            return
        if not self.seen_scores:
            self._before_scores(event, op, role)
        else:
            self._after_scores(event, op, role)

    def _before_scores(self, event, op: str, role) -> None:
        if role == "scores":
            self.seen_scores = True
            self.put(event, "scores")
        elif role == "attn":
            self.seen_scores = True
            self.put(event, "softmax")
        elif any(r.role in COLUMNS for r in event.outputs):
            # One box per column; `q, k, v = qkv.split(...)` feeds all three at once.
            stage = "proj" if op in _LINEAR_OPS else "split"
            for record in event.outputs:
                if record.role in COLUMNS:
                    if stage == "proj":
                        self._input(event, record.role)
                    self.put(event, stage, record.role, record)
        elif op in _LINEAR_OPS:
            # One fused projection (nanoGPT's c_attn) makes Q, K and V at once.
            self._input(event, "QKV")
            self.put(event, "proj", "QKV")

    def _input(self, event, column: str) -> None:
        if not event.inputs:
            return
        record = event.inputs[0]
        label = record.label or "input"
        for node in self.block.nodes:
            if node.stage == "input" and node.record is not None and node.record.label == label:
                return
        node = Node("input", label, record)
        self.block.nodes.append(node)

    def _after_scores(self, event, op: str, role) -> None:
        if role == "scores":
            masked = op in _MASK_OPS or any(r.role == "mask" for r in event.inputs[1:])
            self.put(event, "mask" if masked else "scores")
            if masked:
                node = self.by_key[("mask", "")]
                mask = next(
                    (r for r in event.inputs[1:] if r.dtype == "bool" or r.role == "mask"), None
                )
                if mask is not None and not node.extra:
                    node.extra.append((mask.label or "mask", mask))
        elif role == "attn":
            self.put(event, "softmax")
        elif role == "context":
            if op in _MATMUL_OPS and not self.seen_context:
                self.seen_context = True
                self.put(event, "context")
            elif self.seen_context:
                self.put(event, "merge")
        elif op in _LINEAR_OPS and self.seen_context:
            self.put(event, "out")


# The row a failed op's box goes to, by its step: before the scores, after them.
_FAILED_STAGE = {
    "product": ("scores", "context"),
    "heads": ("split", "merge"),
    "projection": ("proj", "out"),
    "mask": ("mask", "mask"),
    "softmax": ("softmax", "softmax"),
}


def _failed_stage(op: str, builder: _Builder) -> str:
    if op in FUSED_OPS:
        return "fused"
    if op in MHA_OPS:
        return "mha"
    spec = _ops.declared(op)
    before, after = _FAILED_STAGE.get(spec.step if spec else "", ("scores", "out"))
    return after if builder.seen_scores else before


def build_blocks(trace) -> list[Block]:
    """The attention blocks of `trace`, with findings attached to the node they concern.

    Blocks whose stages have the same shapes as an earlier block are folded into
    it (`same_as`), so a 12-layer model draws one diagram, not twelve.
    """
    events = [e for e in trace.events if e.outputs]
    paths = _block_paths(events)
    if not paths:
        # No attention seen (an error before the scores, or no attention at all):
        # one block for the whole trace, drawn from whatever stages exist.
        root = next((e for e in events if not e.module), None)
        paths = [("", root.module_type if root is not None else "")]
    blocks = {path: Block(path, cls) for path, cls in paths}
    builders = {path: _Builder(block) for path, block in blocks.items()}
    path_list = list(blocks)
    owner_of: dict[int, str] = {}
    for event in events:
        owner = _owner(event.module, path_list)
        if owner is None:
            continue
        owner_of[event.index] = owner
        builders[owner].add(event)
    _attach_findings(trace, builders, owner_of, path_list)
    return _fold(list(blocks.values()))


def _attach_findings(trace, builders: dict, owner_of: dict[int, str], paths: list[str]) -> None:
    failed: dict[tuple, Node] = {}
    for number, finding in enumerate(trace.findings):
        index = finding.event_index
        path = owner_of.get(index) if index is not None else None
        if path is None:
            path = _owner(_split_module(finding.module), paths)
        if path is None:
            path = paths[0]
        builder = builders[path]
        node = builder.event_node.get(index) if index is not None else None
        if node is None and index is not None:
            # The op made no box (e.g. `mask == 0`): the next box it fed gets the finding.
            later = sorted(i for i in builder.event_node if i > index)
            if later and index < len(trace.events):
                node = builder.event_node[later[0]]
        if node is None:
            # The op raised before it ran: draw it as a failed box at its stage,
            # one box per op even when it has several findings.
            node = failed.get((path, index, finding.op))
            if node is None:
                stage = _failed_stage(finding.op, builder)
                node = Node(stage, "", None, failed_op=finding.op or "?")
                builder.block.nodes.append(node)
                failed[(path, index, finding.op)] = node
        node.findings.append(number)


def _fold(blocks: list[Block]) -> list[Block]:
    kept: list[Block] = []
    by_signature: dict[tuple, Block] = {}
    for block in blocks:
        has_findings = any(n.findings for n in block.nodes)
        signature = block.signature()
        first = by_signature.get(signature)
        if first is not None and not has_findings:
            first.same_as.append(block.name)
            continue
        if not has_findings:
            by_signature[signature] = block
        kept.append(block)
    return kept
