"""Inputs made from the model's own structure, when the user gives none.

Each forward parameter becomes a `Leaf` (one tensor: activations, token ids or a mask)
or a `Batch` of leaves (a dict, a dataclass, a namespace). A first guess comes from what
the model declares (its first Embedding takes token ids; `mask` in a name makes a mask;
a dataclass annotation or `batch["tokens"]` in the forward makes a batch). Then one
provisional forward, observed through a session with checks off (`run_observed`) and
with module pre-hooks of this module's own, watches what consumes each input first
(`discover`):

- an `nn.Embedding` (or `F.embedding`): token ids, int64 below its num_embeddings;
- an `nn.Linear`, a norm, a conv, `nn.MultiheadAttention`: activations of the width it
  takes, in its layout;
- a mask: the op that applies it to scores. A mask the op reads as it is gets that op's
  polarity (masked_fill and nn.MultiheadAttention's key_padding_mask: True hides; SDPA's
  attn_mask and torch.where: True keeps; added to scores: 0 keeps, -inf hides); a mask
  the code transforms first (`mask == 0`, `~mask`, `1.0 - mask`) follows the common
  convention, 1 marks a real token. Its shape is fitted to the scores it meets.

The inputs are made again until nothing changes. Masks hold real padding: the first
example full, the others shorter with distinct lengths, so the value checks have
something to test. The provisional forward leaves the user's state as it was: no grad,
train/eval modes restored, the RNG untouched, shapeguard's own checks paused; it stops
as soon as every input has been read.
"""

from dataclasses import dataclass

FLOAT, IDS, MASK = "float", "ids", "mask"
# Mask polarity: True (1) marks a real token; True marks padding; additive (0 / -inf).
KEEP, HIDE, ADD = "keep", "hide", "add"

_ID_NAMES = frozenset(
    {"idx", "ids", "tokens", "input_ids", "token_ids", "input_tokens", "src_ids", "tgt_ids"}
)


def is_ids_name(name: str) -> bool:
    low = name.lower()
    return low in _ID_NAMES or low.endswith(("_ids", "_tokens", "_idx"))


def is_mask_name(name: str) -> bool:
    low = name.lower()
    return "mask" in low or "padding" in low or low.startswith("pad")


@dataclass(eq=False, slots=True)
class Leaf:
    """One tensor to make: what it is, its shape, and what the shape was read from."""

    name: str  # "x", "batch['tokens']", "batch.mask"
    kind: str  # FLOAT, IDS or MASK
    shape: tuple[int, ...]
    dtype: str | None = None  # None: the model's dtype (FLOAT), int64 (IDS), bool (MASK)
    vocab: int = 0  # IDS: ids are below it (0: all zeros)
    polarity: str = KEEP  # MASK
    padded: bool = True  # MASK: some examples shorter (False: nothing hidden)
    fixed: bool = False  # shape and dtype given by --input or an annotation
    why: str = ""  # what read it: "tok_emb = nn.Embedding(101, 48)"
    layout: str = "batch_first"  # or "seq_first", for nn.MultiheadAttention(batch_first=False)
    unsure: bool = False  # its width is a placeholder until something reads it
    settled: bool = False  # what first consumed it took it as made (`inputs_blame`)
    # Set while a provisional forward watches it.
    use: "InputUse | None" = None

    def dtype_name(self, model_dtype: str) -> str:
        if self.dtype:
            return self.dtype
        if self.kind == IDS:
            return "int64"
        if self.kind == MASK:
            return model_dtype if self.polarity == ADD else "bool"
        return model_dtype

    def note(self, lengths: tuple[int, ...], ids: str = "") -> str:
        """What its values are, for the inputs line: `ids < 101` (or `ids`, the range the
        maker drew from), `True = padding; lengths 5, 3`."""
        if self.kind != MASK:
            return ids
        if not self.padded:
            return "hides nothing"
        marks = {
            KEEP: "True = real token" if self.dtype in (None, "bool") else "1 = real token",
            HIDE: "True = padding",
            ADD: "0 = real token, -inf = padding",
        }[self.polarity]
        return f"{marks}; lengths {', '.join(map(str, lengths))}" if lengths else marks


@dataclass(eq=False, slots=True)
class Batch:
    """A forward parameter that is a dict, a dataclass or a namespace of tensors."""

    name: str
    kind: str  # "dict", "dataclass" or "namespace"
    fields: dict[str, Leaf]
    cls: type | None = None


@dataclass(slots=True)
class InputUse:
    """The first thing that read a leaf (for a mask: the op that applied it to scores)."""

    what: str  # "module", "mha", "conv1d", or an op's name
    via: str  # "direct": the leaf itself, "view": views and casts of it, "arith": more
    module: object = None
    param: str = ""  # the module's parameter it went to
    shape: tuple = ()  # the shape of what the op got (the leaf, or what was made of it)
    target: tuple = ()  # for a mask: the shape of the scores it met
    width: int | None = None
    vocab: int | None = None
    polarity: str = ""  # for a mask: what the op reads (KEEP, HIDE, ADD)
    subtracted: bool = False  # a bool mask went into `1 - mask`: it must be a number
