"""shapeguard side by side with plain torch, jaxtyping + beartype, and torchinfo.

Eight attention bugs, each a small module with the bug on one marked line. Every
tool runs every bug, and each cell of the table comes from that run:

- raised: an error, a warning, or nothing;
- when: before the bad line completes (the tool's own check), at the bad op
  (torch's own error, passed through or wrapped), or after the bad line (a check
  on the return value). A marker call right after the bad line tells which;
- names tensor / names axis: whether the text the user sees (the exception and
  its chained causes, or the warning) contains one of the user's names for the
  tensors involved (Q, K, mask, context, ...) and one of the axis names
  (d_k, seq, heads, ...), as whole words.

The tools: plain torch (just call the module); jaxtyping + beartype on an
annotated copy (`@jaxtyped(typechecker=beartype)` on a forward whose arguments
and return carry `Float[Tensor, "batch seq d_model"]`-style annotations, as a
jaxtyping user annotates an nn.Module); torchinfo (`summary(model,
input_data=...)`); shapeguard (`shapeguard.guard(model)`, defaults, on the plain
module, no annotations). Sizes are pairwise distinct: batch 2, seq 7, memory 9,
d_model 48, heads 4, d_k 12.
"""

import math
import re
import warnings
from dataclasses import dataclass, field

from _timing import MIN_REPEATS, Section, Table, Variant, compare, fmt_seconds, paired_ratio

B, T, S_MEM, D, H = 2, 7, 9, 48, 4

# Set by _reached() in each bug module right after its bad line.
_progress = {"reached": False}


def _reached() -> None:
    _progress["reached"] = True


def _bug_modules():
    """(key, title, build, inputs, signature, tensor names, axis names) for each bug."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        """The correct module the bugs are made from (also the overhead subject)."""

        def __init__(self, d_model=D, n_heads=H):
            super().__init__()
            self.d_model = d_model
            self.n_heads = n_heads
            self.d_k = d_model // n_heads
            self.W_q = nn.Linear(d_model, d_model)
            self.W_k = nn.Linear(d_model, d_model)
            self.W_v = nn.Linear(d_model, d_model)
            self.out = nn.Linear(d_model, d_model)

        def forward(self, x):
            B, T, _ = x.shape
            H, d_k = self.n_heads, self.d_k
            Q = self.W_q(x).view(B, T, H, d_k).transpose(1, 2)  # [B, H, T, d_k]
            K = self.W_k(x).view(B, T, H, d_k).transpose(1, 2)
            V = self.W_v(x).view(B, T, H, d_k).transpose(1, 2)
            scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)  # [B, H, T, T]
            attn = F.softmax(scores, dim=-1)
            context = (attn @ V).transpose(1, 2).reshape(B, T, self.d_model)
            return self.out(context)

    class HeadsNotDividing(Attention):
        def __init__(self):
            super().__init__(d_model=D, n_heads=5)  # BUG: 48 // 5 = 9, and 5 * 9 = 45

        def forward(self, x):
            B = x.size(0)
            Q = self.W_q(x).view(B, -1, self.n_heads, self.d_k).transpose(1, 2)  # bad line
            _reached()
            K = self.W_k(x).view(B, -1, self.n_heads, self.d_k).transpose(1, 2)
            V = self.W_v(x).view(B, -1, self.n_heads, self.d_k).transpose(1, 2)
            scores = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)
            context = (F.softmax(scores, dim=-1) @ V).transpose(1, 2).reshape(B, -1, self.d_model)
            return self.out(context)

    class KNotTransposed(Attention):
        def forward(self, x):
            B, T, _ = x.shape
            H, d_k = self.n_heads, self.d_k
            Q = self.W_q(x).view(B, T, H, d_k).transpose(1, 2)
            K = self.W_k(x).view(B, T, H, d_k).transpose(1, 2)
            V = self.W_v(x).view(B, T, H, d_k).transpose(1, 2)
            scores = Q @ K / math.sqrt(d_k)  # BUG: K, not K^T
            _reached()
            context = (F.softmax(scores, dim=-1) @ V).transpose(1, 2).reshape(B, T, self.d_model)
            return self.out(context)

    class LinearWidth(Attention):
        def __init__(self):
            super().__init__()
            self.out = nn.Linear(self.d_k, self.d_model)  # BUG: merged heads have d_model features

        def forward(self, x):
            B, T, _ = x.shape
            H, d_k = self.n_heads, self.d_k
            Q = self.W_q(x).view(B, T, H, d_k).transpose(1, 2)
            K = self.W_k(x).view(B, T, H, d_k).transpose(1, 2)
            V = self.W_v(x).view(B, T, H, d_k).transpose(1, 2)
            scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)
            context = (F.softmax(scores, dim=-1) @ V).transpose(1, 2).reshape(B, T, self.d_model)
            out = self.out(context)  # bad line
            _reached()
            return out

    class BatchSeqMask(Attention):
        def forward(self, x, keep):
            B, T, _ = x.shape  # keep: [B, T], True for real tokens
            H, d_k = self.n_heads, self.d_k
            Q = self.W_q(x).view(B, T, H, d_k).transpose(1, 2)
            K = self.W_k(x).view(B, T, H, d_k).transpose(1, 2)
            V = self.W_v(x).view(B, T, H, d_k).transpose(1, 2)
            scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)
            scores = scores.masked_fill(~keep, float("-inf"))  # BUG: keep is [B, T]
            _reached()
            context = (F.softmax(scores, dim=-1) @ V).transpose(1, 2).reshape(B, T, self.d_model)
            return self.out(context)

    class ViewAfterTranspose(Attention):
        def forward(self, x):
            B, T, _ = x.shape
            H, d_k = self.n_heads, self.d_k
            Q = self.W_q(x).view(B, T, H, d_k).transpose(1, 2)
            K = self.W_k(x).view(B, T, H, d_k).transpose(1, 2)
            V = self.W_v(x).view(B, T, H, d_k).transpose(1, 2)
            scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)
            context = (F.softmax(scores, dim=-1) @ V).transpose(1, 2)
            context = context.view(B, T, self.d_model)  # BUG: needs .contiguous() first
            _reached()
            return self.out(context)

    class SdpaKvLength(Attention):
        def forward(self, x, memory):
            B, T, _ = x.shape
            S = memory.shape[1]
            H, d_k = self.n_heads, self.d_k
            Q = self.W_q(x).view(B, T, H, d_k).transpose(1, 2)  # [B, H, T, d_k]
            K = self.W_k(memory).view(B, S, H, d_k).transpose(1, 2)  # [B, H, S, d_k]
            V = self.W_v(x).view(B, T, H, d_k).transpose(1, 2)  # BUG: values from x, not memory
            context = F.scaled_dot_product_attention(Q, K, V)  # bad line
            _reached()
            return self.out(context.transpose(1, 2).reshape(B, T, self.d_model))

    class WrongHeadSplit(Attention):
        def forward(self, x):
            B, T, _ = x.shape
            H, d_k = self.n_heads, self.d_k
            Q = self.W_q(x).view(B, H, T, d_k)  # BUG: [B, T, d_model] is not [B, H, T, d_k]
            _reached()
            K = self.W_k(x).view(B, H, T, d_k)
            V = self.W_v(x).view(B, H, T, d_k)
            scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)
            context = (F.softmax(scores, dim=-1) @ V).transpose(1, 2).reshape(B, T, self.d_model)
            return self.out(context)

    class BatchFirst(nn.Module):
        def __init__(self, d_model=D, n_heads=H):
            super().__init__()
            self.attn = nn.MultiheadAttention(d_model, n_heads)  # BUG: batch_first=False
            self.norm = nn.LayerNorm(d_model)

        def forward(self, x):  # x: [B, T, d_model]
            context, _ = self.attn(x, x, x, need_weights=False)  # bad line
            _reached()
            return self.norm(x + context)

    def x_only():
        return (torch.randn(B, T, D),)

    def with_keep():
        keep = torch.ones(B, T, dtype=torch.bool)
        keep[0, -2:] = False  # padding at the end of the first sequence
        return (torch.randn(B, T, D), keep)

    def with_memory():
        return (torch.randn(B, T, D), torch.randn(B, S_MEM, D))

    qk_axes = {"d_k", "seq", "seq_q", "seq_k"}
    return Attention, [
        ("heads", "heads not dividing d_model (48 / 5)", HeadsNotDividing, x_only, "x",
         {"Q", "W_q(x)", "x"}, {"d_model", "n_heads", "heads", "d_k"}),
        ("k_not_t", "K not transposed", KNotTransposed, x_only, "x", {"Q", "K"}, qk_axes),
        ("linear", "wrong Linear width", LinearWidth, x_only, "x",
         {"context", "out"}, {"d_model", "d_k", "in_features"}),
        ("mask", "[batch, seq] mask on [batch, heads, seq, seq] scores", BatchSeqMask, with_keep,
         "keep", {"keep", "~keep", "mask", "scores"}, {"batch", "seq", "seq_q", "seq_k"}),
        ("view", "view after transpose", ViewAfterTranspose, x_only, "x",
         {"context"}, {"heads", "d_k", "seq", "seq_q"}),
        ("sdpa", "SDPA k/v length mismatch", SdpaKvLength, with_memory, "memory",
         {"K", "V"}, {"seq", "seq_k", "seq_q"}),
        ("split", "wrong head split (view(B, H, T, d_k))", WrongHeadSplit, x_only, "x",
         {"Q", "W_q(x)"}, {"seq", "heads", "d_model"}),
        ("batch_first", "batch_first=False given [batch, seq, embed]", BatchFirst, x_only, "x",
         {"x"}, {"batch", "seq"}),
    ]  # fmt: skip


def _annotated(cls, signature: str, *, jaxtyped_: bool):
    """A copy of `cls` whose forward carries jaxtyping annotations (checked by beartype
    through `@jaxtyped` when `jaxtyped_`; shapeguard reads the same annotations)."""
    from beartype import beartype
    from jaxtyping import Bool, Float, jaxtyped
    from torch import Tensor

    if signature == "x":

        def forward(
            self, x: Float[Tensor, "batch seq d_model"]
        ) -> Float[Tensor, "batch seq d_model"]:
            return cls.forward(self, x)

    elif signature == "keep":

        def forward(
            self, x: Float[Tensor, "batch seq d_model"], keep: Bool[Tensor, "batch seq"]
        ) -> Float[Tensor, "batch seq d_model"]:
            return cls.forward(self, x, keep)

    else:

        def forward(
            self,
            x: Float[Tensor, "batch seq_q d_model"],
            memory: Float[Tensor, "batch seq_k d_model"],
        ) -> Float[Tensor, "batch seq_q d_model"]:
            return cls.forward(self, x, memory)

    if jaxtyped_:
        forward = jaxtyped(typechecker=beartype)(forward)
    suffix = "Jaxtyped" if jaxtyped_ else "Annotated"
    return type(cls.__name__ + suffix, (cls,), {"forward": forward})


@dataclass
class Outcome:
    raised: str  # "error", "warning", "no"
    when: str  # "before", "at the op", "after", "-"
    own: bool  # the tool's own check (not torch's error passed through)
    text: str = ""
    messages: list = field(default_factory=list)  # str() of the error and its causes
    names_tensor: bool = False
    names_axis: bool = False
    notes: list = field(default_factory=list)

    def cell(self) -> str:
        if self.raised == "no":
            return "no"
        origin = "own check" if self.own else "torch's error"
        named = [w for w, ok in (("tensor", self.names_tensor), ("axis", self.names_axis)) if ok]
        names = "names " + " and ".join(named) if named else "names neither"
        return f"{self.raised}, {self.when} ({origin}); {names}"


def _chain(error: BaseException) -> list[BaseException]:
    seen, out = set(), []
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        out.append(error)
        error = error.__cause__ or error.__context__
    return out


def _mentions(text: str, words: set[str]) -> bool:
    return any(re.search(r"(?<![\w.])" + re.escape(w) + r"(?![\w(])", text) for w in words)


def _run_tool(prepare, inputs, torch_message: str | None) -> Outcome:
    """Prepare the model (guard, annotate) and call it; classify what came out."""
    _progress["reached"] = False
    caught: list[tuple[str, bool]] = []

    def showwarning(message, category, filename, lineno, file=None, line=None):
        caught.append((str(message), _progress["reached"]))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = showwarning
        try:
            call = prepare()
            call(*inputs)
        except Exception as error:  # every tool's error is the subject here
            chain = _chain(error)
            text = "\n".join(f"{type(e).__name__}: {e}" for e in chain)
            own = torch_message is None or all(str(e) != torch_message for e in chain)
            when = "after" if _progress["reached"] else ("before" if own else "at the op")
            return Outcome("error", when, own, text, [str(e) for e in chain])
    if caught:
        text = "\n".join(m for m, _ in caught)
        when = "after" if caught[0][1] else "before"
        return Outcome("warning", when, True, text)
    return Outcome("no", "-", False)


def _tools(Attention):
    """(name, prepare(cls, signature) -> callable) for each tool."""
    import torch

    import shapeguard

    def plain(cls, signature):
        torch.manual_seed(0)
        return cls()

    def jaxtyping_beartype(cls, signature):
        torch.manual_seed(0)
        return _annotated(cls, signature, jaxtyped_=True)()

    def torchinfo_summary(cls, signature):
        from torchinfo import summary

        torch.manual_seed(0)
        model = cls()
        return lambda *inputs: summary(model, input_data=list(inputs), verbose=0, device="cpu")

    def shapeguard_guard(cls, signature):
        torch.manual_seed(0)
        return shapeguard.guard(cls())

    return [
        ("plain torch", plain),
        ("jaxtyping + beartype", jaxtyping_beartype),
        ("torchinfo", torchinfo_summary if _has_torchinfo() else None),
        ("shapeguard", shapeguard_guard),
    ]


def _has_torchinfo() -> bool:
    import importlib.util

    return importlib.util.find_spec("torchinfo") is not None


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def bug_table() -> tuple[Table, dict]:
    """Run every tool on every bug; the table and the outcomes by (bug, tool)."""
    import torch

    Attention, bugs = _bug_modules()
    tools = _tools(Attention)
    outcomes: dict[tuple[str, str], Outcome] = {}
    rows = []
    for key, title, cls, inputs, signature, tensors, axes in bugs:
        torch.manual_seed(2)
        args = inputs()
        torch_message = None
        row = [title]
        for tool, prepare in tools:
            if prepare is None:
                row.append("not installed (`pip install torchinfo`)")
                continue
            outcome = _run_tool(lambda p=prepare, c=cls, s=signature: p(c, s), args, torch_message)
            if tool == "plain torch" and outcome.raised == "error":
                # What torch itself says for this bug: a tool's error that carries this
                # exact text is torch's error passed through, not the tool's own check.
                outcome.own = False
                outcome.when = "at the op"
                torch_message = outcome.messages[0]
            outcome.names_tensor = outcome.raised != "no" and _mentions(outcome.text, tensors)
            outcome.names_axis = outcome.raised != "no" and _mentions(outcome.text, axes)
            outcomes[(key, tool)] = outcome
            row.append(outcome.cell())
        rows.append(row)
    table = Table(
        "The same eight bugs through four tools",
        ["bug", *(tool for tool, _ in tools)],
        rows,
        [
            "Each cell: what the user gets (error, warning, or no), when (before: raised before "
            "the bad line completed; at the op: torch's own error at the bad op; after: raised "
            "after the bad line ran, e.g. by a return-value check), whose check (the tool's own, "
            "or torch's error passed through or wrapped), and whether the message (with its "
            "chained causes) names the tensor and the axis: one of the user's names for the "
            "tensors involved (Q, K, V, mask, keep, scores, context, x) and for the axes (batch, "
            "seq, heads, d_k, d_model, ...), as whole words. shapeguard warnings become errors "
            "with `strict=True`.",
        ],
    )
    return table, outcomes


def summary_table(outcomes: dict) -> Table:
    """Per tool: how many of the bugs it caught with its own check, and how well it said so."""
    tools = []
    for _, tool in outcomes:
        if tool not in tools:
            tools.append(tool)
    bugs = {bug for bug, _ in outcomes}
    rows = []
    for tool in tools:
        mine = [outcomes[(bug, t)] for bug, t in outcomes if t == tool]
        rows.append(
            [
                tool,
                f"{sum(o.raised != 'no' for o in mine)}/{len(bugs)}",
                f"{sum(o.raised != 'no' and o.own for o in mine)}/{len(bugs)}",
                f"{sum(o.raised != 'no' and o.own and o.when == 'before' for o in mine)}/{len(bugs)}",
                f"{sum(o.names_tensor for o in mine)}/{len(bugs)}",
                f"{sum(o.names_axis for o in mine)}/{len(bugs)}",
            ]
        )
    return Table(
        "Bugs flagged, per tool (counted from the next table)",
        [
            "tool",
            "raised or warned",
            "by its own check",
            "own check, before the bad line",
            "names the tensor",
            "names the axis",
        ],
        rows,
    )


def overhead_table(quick: bool = False) -> Table:
    """Per-call cost of shapeguard vs jaxtyping + beartype on the same (correct) module."""
    import torch

    import shapeguard

    Attention, _ = _bug_modules()
    # Tiny only: the Contracts section makes the same comparison on the seed MHA at the
    # medium size too, and the medium forward is where a full run spends its minutes.
    sizes = [("tiny", 2, 16, 64)]
    repeats = 3 if quick else MIN_REPEATS
    rows = []
    for label, b, s, d in sizes:

        def build(cls, guard=None, _d=d):
            torch.manual_seed(0)
            model = cls(d_model=_d, n_heads=8).eval()
            return shapeguard.guard(model, **guard) if guard is not None else model

        annotated = _annotated(Attention, "x", jaxtyped_=False)
        models = {
            "plain": build(Attention),
            "jaxtyping + beartype": build(_annotated(Attention, "x", jaxtyped_=True)),
            "shapeguard, contract only (ops=False)": build(annotated, {"ops": False}),
            "shapeguard guard (contract + every op)": build(annotated, {}),
            'shapeguard guard(check="first")': build(annotated, {"check": "first"}),
        }
        torch.manual_seed(1)
        x = torch.randn(b, s, d)

        def call(model, x=x):
            def run():
                with torch.no_grad():
                    model(x)

            return run

        timings = compare(
            [Variant(name, call(model)) for name, model in models.items()],
            repeats=repeats,
            min_sample_s=0.0 if quick else 0.02,
        )
        jax = timings["jaxtyping + beartype"]
        for name, timing in timings.items():
            rows.append(
                [
                    f"{label} (B={b}, S={s}, D={d})",
                    name,
                    fmt_seconds(timing.seconds),
                    f"{timing.ratio_text()} ({timing.spread_text()})",
                    f"{paired_ratio(timing, jax):.2f}x",
                ]
            )
    return Table(
        "Per-call cost on the same module: shapeguard vs jaxtyping + beartype",
        ["size", "variant", "time per call", "vs plain", "vs jaxtyping + beartype"],
        rows,
        [
            "The correct attention module of the bug table (8 heads), with the same "
            "annotations for both tools; eval mode, `torch.no_grad()`, one thread, median of "
            f"{repeats} interleaved rounds (interquartile range of the per-round ratios in "
            "parentheses). jaxtyping + beartype check the forward's boundary only; "
            "`ops=False` is shapeguard's like-for-like setting. The Contracts section makes the "
            "same comparison on the seed MHA at the tiny and medium sizes.",
        ],
    )


def run(quick: bool = False) -> Section:
    """The side-by-side section: the bug table, its per-tool summary, and the cost table."""
    from _timing import one_thread

    one_thread()
    table, outcomes = bug_table()
    return Section(
        "Side by side with other shape tools",
        tables=[summary_table(outcomes), table, overhead_table(quick)],
    )
