"""A hand-written port of the transformers Llama architecture, and its variants, for `shapeguard diff`.

The port is written the way a user writes one: plain nn.Modules with their own names (its own
rotary, attention, MLP, RMSNorm and blocks), weights copied from a transformers
LlamaForCausalLM through `port_name`, a mapping of state-dict names. The correct port's logits
match transformers' at float32 tolerance (tests/test_diff_names.py).

Each variant introduces one named difference (`shapeguard._diff.explain.KINDS`) in one of two
code styles ("a" or "b"), so a test can tell that the difference, not a spelling, is named:

    transpose      scores computed as k·qᵀ: matmul(k, qᵀ) | einsum "bhid,bhjd->bhji"
    head_grouping  heads split (d h):       view + permute | einops.rearrange
    rotary_pairing pairs interleaved:       stack/flatten  | complex multiply (Meta's Llama)
    scale          1/sqrt(d_model):         divide scores  | scale q before einsum
    shift          positions start at 1:    arange(1, T+1) | slice a table [1 : T+1]
    reverse        sequence reversed:       flip           | index with a reversed arange
    roll           rolled by one, no unroll: torch.roll    | cat of the last and the rest
    mask_polarity  keep/masked swapped:     triu(1) as keep | additive -inf on the kept
    mask_axis      causal on the key axis:  triu as keep   | i <= j comparison
    bias           q/k/v bias dropped:      Linear(bias=False) | F.linear without the bias

`build(setting, variant, style)` makes both models from one tiny config with the weights
copied; `ref_taps` and `port_taps` give the tensors of layer 0 that the diff engine aligns,
under the same names, so a test can build the pair the engine would see.
"""

import math
from dataclasses import dataclass

import einops
import torch
import torch.nn.functional as F
from torch import nn

VOCAB, THETA, EPS = 101, 10000.0, 1e-6
VARIANTS = (
    "correct",
    "transpose",
    "head_grouping",
    "rotary_pairing",
    "scale",
    "shift",
    "reverse",
    "roll",
    "mask_polarity",
    "mask_axis",
    "bias",
)
STYLES = ("a", "b")


@dataclass(frozen=True)
class Setting:
    name: str
    batch: int
    heads: int
    seq: int
    head_dim: int
    layers: int = 1

    @property
    def d_model(self) -> int:
        return self.heads * self.head_dim


SETTINGS = (
    Setting("distinct", batch=3, heads=4, seq=7, head_dim=16),
    Setting("coincident", batch=4, heads=4, seq=4, head_dim=4),
    Setting("realistic", batch=4, heads=8, seq=64, head_dim=64),
)


def llama_config(s: Setting):
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=s.d_model,
        intermediate_size=3 * s.d_model // 2 + 5,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.heads,
        head_dim=s.head_dim,
        attention_bias=True,
        rope_theta=THETA,
        rms_norm_eps=EPS,
        max_position_embeddings=2 * s.seq + 2,
    )
    config._attn_implementation = "eager"
    return config


# -- the port ----------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
        return self.scale * (x * rms)


class Rotary(nn.Module):
    """cos and sin per position, (1, seq, head_dim), half-split: [f0..f(D/2-1), f0..]."""

    def __init__(self, head_dim: int, max_len: int, variant: str, style: str):
        super().__init__()
        self.variant, self.style = variant, style
        freqs = 1.0 / THETA ** (torch.arange(0, head_dim, 2).float() / head_dim)
        self.register_buffer("freqs", freqs, persistent=False)
        angles = torch.outer(torch.arange(max_len).float(), freqs)
        self.register_buffer("table", torch.cat((angles, angles), -1), persistent=False)

    def forward(self, batch: int, seq: int):
        if self.variant == "shift" and self.style == "a":
            positions = torch.arange(1, seq + 1).float()  # bug: positions start at 1
            angles = torch.outer(positions, self.freqs)
            emb = torch.cat((angles, angles), -1)
        elif self.variant == "shift":
            emb = self.table[1 : seq + 1]  # bug: the table read from 1
        else:
            emb = self.table[:seq]
        return emb.cos()[None], emb.sin()[None]  # one row, broadcast over the batch


def rotate_half_split(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), -1) * sin


def rotate_interleaved(x, cos, sin, style: str):
    half = x.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]
    if style == "a":
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), -1).flatten(-2)
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], half, 2).contiguous())
    return torch.view_as_real(pairs * torch.complex(c, s)).flatten(-2)


class Attention(nn.Module):
    def __init__(self, s: Setting, variant: str, style: str):
        super().__init__()
        self.heads, self.head_dim = s.heads, s.head_dim
        self.variant, self.style = variant, style
        C = s.d_model
        dropped = variant == "bias" and style == "a"
        self.wq = nn.Linear(C, C, bias=not dropped)
        self.wk = nn.Linear(C, C, bias=not dropped)
        self.wv = nn.Linear(C, C, bias=not dropped)
        self.wo = nn.Linear(C, C, bias=True)
        self.taps: dict[str, torch.Tensor] | None = None

    def tap(self, name: str, t):
        if self.taps is not None:
            self.taps[name] = t.detach()
        return t

    def project(self, linear: nn.Linear, x):
        if self.variant == "bias" and self.style == "b":
            return F.linear(x, linear.weight)  # bug: the bias is not added
        return linear(x)

    def split_heads(self, x):
        B, T, _ = x.shape
        H, D = self.heads, self.head_dim
        if self.variant == "head_grouping" and self.style == "a":
            return x.view(B, T, D, H).permute(0, 3, 1, 2)  # bug: (d h)
        if self.variant == "head_grouping":
            return einops.rearrange(x, "b t (d h) -> b h t d", h=H)  # bug: (d h)
        return x.view(B, T, H, D).transpose(1, 2)

    def reorder(self, x):
        T = x.shape[1]
        if self.variant == "reverse":
            return x.flip(1) if self.style == "a" else x[:, torch.arange(T - 1, -1, -1)]
        if self.variant == "roll":
            if self.style == "a":
                return torch.roll(x, 1, dims=1)
            return torch.cat((x[:, -1:], x[:, :-1]), 1)
        return x

    def rotate(self, x, cos, sin):
        cos, sin = cos[:, None], sin[:, None]
        if self.variant == "rotary_pairing":
            return rotate_interleaved(x, cos, sin, self.style)
        return rotate_half_split(x, cos, sin)

    def scores(self, q, k):
        D, C = self.head_dim, self.heads * self.head_dim
        if self.variant == "transpose" and self.style == "a":
            return torch.matmul(k, q.transpose(-2, -1)) * D**-0.5
        if self.variant == "transpose":
            return torch.einsum("bhid,bhjd->bhji", q, k) * D**-0.5
        if self.variant == "scale" and self.style == "a":
            return torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(C)
        if self.variant == "scale":
            return torch.einsum("bhid,bhjd->bhij", q * C**-0.5, k)
        return torch.matmul(q, k.transpose(-2, -1)) * D**-0.5

    def masked(self, scores):
        T = scores.shape[-1]
        low = torch.finfo(scores.dtype).min
        if self.variant == "mask_polarity" and self.style == "a":
            keep = torch.ones(T, T, dtype=torch.bool).triu(1)  # bug: the masked set as keep
            return scores.masked_fill(~keep, low)
        if self.variant == "mask_polarity":
            keep = torch.ones(T, T, dtype=torch.bool).tril()
            return scores + torch.zeros(T, T).masked_fill(keep, float("-inf"))  # bug
        if self.variant == "mask_axis" and self.style == "a":
            keep = torch.ones(T, T, dtype=torch.bool).triu()  # bug: tril meant
            return scores.masked_fill(~keep, low)
        pos = torch.arange(T)
        if self.variant == "mask_axis":
            keep = pos[:, None] <= pos[None, :]  # bug: i >= j meant
        else:
            keep = pos[:, None] >= pos[None, :]
        return scores.masked_fill(~keep, low)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        x = self.reorder(x)
        q = self.tap("q_proj", self.project(self.wq, x))
        k = self.tap("k_proj", self.project(self.wk, x))
        v = self.project(self.wv, x)
        q, k, v = self.tap("q", self.split_heads(q)), self.split_heads(k), self.split_heads(v)
        q, k = self.tap("q_rot", self.rotate(q, cos, sin)), self.rotate(k, cos, sin)
        scores = self.tap("scores", self.scores(q, k))
        attn = self.tap("attn", torch.softmax(self.masked(scores), dim=-1))
        context = (attn @ v).transpose(1, 2).reshape(B, T, C)
        return self.tap("out", self.wo(context))


class MLP(nn.Module):
    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(d_model, hidden, bias=False)
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, s: Setting, hidden: int, variant: str, style: str):
        super().__init__()
        self.attn_norm = RMSNorm(s.d_model)
        self.attn = Attention(s, variant, style)
        self.mlp_norm = RMSNorm(s.d_model)
        self.mlp = MLP(s.d_model, hidden)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class PortLlama(nn.Module):
    def __init__(self, s: Setting, hidden: int, variant: str = "correct", style: str = "a"):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, s.d_model)
        self.rotary = Rotary(s.head_dim, 2 * s.seq + 2, variant, style)
        self.blocks = nn.ModuleList(Block(s, hidden, variant, style) for _ in range(s.layers))
        self.norm = RMSNorm(s.d_model)
        self.head = nn.Linear(s.d_model, VOCAB, bias=False)

    def forward(self, ids):
        B, T = ids.shape
        x = self.embed(ids)
        cos, sin = self.rotary(B, T)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))


# -- the weight mapping ------------------------------------------------------------------
_PARTS = {
    "self_attn.q_proj": "attn.wq",
    "self_attn.k_proj": "attn.wk",
    "self_attn.v_proj": "attn.wv",
    "self_attn.o_proj": "attn.wo",
    "mlp.gate_proj": "mlp.gate",
    "mlp.up_proj": "mlp.up",
    "mlp.down_proj": "mlp.down",
    "input_layernorm.weight": "attn_norm.scale",
    "post_attention_layernorm.weight": "mlp_norm.scale",
}


def port_name(hf_name: str) -> str:
    """The port's state-dict name for a LlamaForCausalLM one."""
    fixed = {
        "model.embed_tokens.weight": "embed.weight",
        "model.norm.weight": "norm.scale",
        "lm_head.weight": "head.weight",
    }
    if hf_name in fixed:
        return fixed[hf_name]
    _, _, index, rest = hf_name.split(".", 3)  # model.layers.N.rest
    for theirs, ours in _PARTS.items():
        if rest.startswith(theirs):
            return f"blocks.{index}.{ours}{rest[len(theirs) :]}"
    raise KeyError(hf_name)


def copy_weights(ref: nn.Module, port: nn.Module) -> None:
    """Copy ref's weights into port by `port_name`; a port without a bias keeps none."""
    ours = port.state_dict()
    mapped = {port_name(n): w for n, w in ref.state_dict().items()}
    port.load_state_dict({n: w for n, w in mapped.items() if n in ours}, strict=True)


def build(s: Setting, variant: str = "correct", style: str = "a", seed: int = 0):
    """(reference, port, token ids): a LlamaForCausalLM and the port, weights copied, eval."""
    from transformers import LlamaForCausalLM

    config = llama_config(s)
    torch.manual_seed(seed)
    ref = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # the init leaves biases zero: a dropped bias must show
        for name, p in ref.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    port = PortLlama(s, config.intermediate_size, variant, style).eval()
    copy_weights(ref, port)
    ids = torch.randint(3, VOCAB, (s.batch, s.seq), generator=torch.Generator().manual_seed(seed))
    return ref, port, ids


# -- the tensors the engine aligns (layer 0) ---------------------------------------------
def ref_taps(ref: nn.Module, ids) -> dict[str, torch.Tensor]:
    """Layer 0's tensors of the transformers model, named as `Attention.tap` names them.

    Module hooks give q_proj, k_proj, the rotary's cos, the attention's mask and attention
    weights and its output; Q after rotary and the scores are recomputed from them with
    transformers' own `apply_rotary_pos_emb` and eager's product, as eager computes them.
    """
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    attn = ref.model.layers[0].self_attn
    got: dict = {}
    handles = [
        attn.q_proj.register_forward_hook(lambda m, a, o: got.__setitem__("q_proj", o)),
        attn.k_proj.register_forward_hook(lambda m, a, o: got.__setitem__("k_proj", o)),
        ref.model.rotary_emb.register_forward_hook(lambda m, a, o: got.__setitem__("rope", o)),
        attn.register_forward_hook(lambda m, a, o: got.__setitem__("attn_out", o)),
    ]
    try:
        with torch.no_grad():
            ref(ids)
    finally:
        for h in handles:
            h.remove()
    B, T = ids.shape
    H, D = attn.config.num_attention_heads, attn.head_dim
    cos, sin = got["rope"]
    q = got["q_proj"].view(B, T, H, D).transpose(1, 2)
    k = got["k_proj"].view(B, T, H, D).transpose(1, 2)
    q_rot, k_rot = apply_rotary_pos_emb(q, k, cos, sin)
    out, weights = got["attn_out"]
    return {
        "q_proj": got["q_proj"],
        "k_proj": got["k_proj"],
        "cos": cos,
        "sin": sin,
        "q": q,
        "q_rot": q_rot,
        "scores": torch.matmul(q_rot, k_rot.transpose(2, 3)) * attn.scaling,
        "attn": weights,
        "out": out,
    }


def port_taps(port: PortLlama, ids) -> dict[str, torch.Tensor]:
    """Layer 0's tensors of the port (the attention's taps and the rotary's output)."""
    attn = port.blocks[0].attn
    attn.taps = {}
    got: dict = {}
    handle = port.rotary.register_forward_hook(lambda m, a, o: got.__setitem__("rope", o))
    try:
        with torch.no_grad():
            port(ids)
        taps = dict(attn.taps)
    finally:
        handle.remove()
        attn.taps = None
    taps["cos"], taps["sin"] = got["rope"]
    return taps


AXES = {
    "q_proj": ("batch", "seq", "d_model"),
    "k_proj": ("batch", "seq", "d_model"),
    "cos": ("batch", "seq", "head_dim"),
    "sin": ("batch", "seq", "head_dim"),
    "q": ("batch", "heads", "seq", "head_dim"),
    "q_rot": ("batch", "heads", "seq", "head_dim"),
    "scores": ("batch", "heads", "q_seq", "k_seq"),
    "attn": ("batch", "heads", "q_seq", "k_seq"),
    "out": ("batch", "seq", "d_model"),
}
