"""Axis names and roles from provenance, on attention code nobody on the project wrote.

Every model here is a tiny `transformers` model built from a config object (no weights,
no download), traced once with `shapeguard.trace(model, ...)`. The assertions are on the
named shapes a user reads in the trace (`[batch=3, heads=4, seq_q=7, seq_k=7]`) and on the
roles (`scores` is the query-key product, `attn` its softmax), above all where sizes
coincide (batch == seq == head_dim, batch == kv_heads, prompt length == head_dim,
seq == d_model): names come from dataflow, so coincident sizes must change nothing.

Also the reproducers of the field report on real third-party models (`real-models.md`:
problems 1, 2, 5 and 6; `r1_padding.py`, `r2_names.py`, `r3_seq_eq_dk.py`,
`r3b_rotary_real.py`, `r4b_mixtral_real_heads.py`), rerun as tests.
"""

import json
import warnings
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import shapeguard

pytestmark = pytest.mark.no_shapeguard

T = pytest.importorskip("transformers", reason="transformers is not installed (test extra)")

VOCAB = 100


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _trace(model, *args, **kwargs):
    """One traced forward in warn mode (findings collected, nothing raised)."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return shapeguard.trace(model.eval(), *args, mode="warn", **kwargs)


def _ids(batch, seq, seed=0):
    return torch.randint(3, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _ones(batch, seq):
    return torch.ones(batch, seq, dtype=torch.long)


def _kinds(t):
    return [(f.kind, f.message.splitlines()[0]) for f in t.findings]


def _named(records):
    return [r.named_shape for r in records]


def _out(t, op, module_part, role=None, ndim=None):
    """Output records of `op` events inside a module whose path contains `module_part`."""
    found = []
    for ev in t.events:
        if ev.op != op or module_part not in ev.module:
            continue
        for r in ev.outputs:
            if role is not None and r.role != role:
                continue
            if ndim is not None and len(r.shape) != ndim:
                continue
            found.append(r)
    return found


def _head_splits(t, module_part):
    """{role: (view record, the transpose right after it)} for Q, K and V."""
    events = t.events
    splits = {}
    for i, ev in enumerate(events):
        if ev.op != "view" or not ev.module.endswith(module_part) or not ev.outputs:
            continue
        r = ev.outputs[0]
        if r.role not in ("Q", "K", "V") or len(r.shape) != 4 or r.role in splits:
            continue
        nxt = events[i + 1] if i + 1 < len(events) else None
        moved = nxt.outputs[0] if nxt is not None and nxt.op == "transpose" else None
        splits[r.role] = (r, moved)
    return splits


# -- the models -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sizes:
    id: str
    batch: int
    seq: int
    heads: int
    kv_heads: int  # for families without grouped-query attention: heads
    head_dim: int
    dec_seq: int  # decoder length (T5)

    @property
    def hidden(self):
        return self.heads * self.head_dim


# batch, seq, heads, kv_heads, head_dim: pairwise distinct in the first, then coinciding.
GQA_SIZES = [
    Sizes("distinct", 3, 7, 4, 2, 16, 5),
    Sizes("batch=seq=head_dim", 8, 8, 4, 2, 8, 8),
    Sizes("batch=kv_heads", 2, 7, 4, 2, 16, 5),
    Sizes("seq=d_model", 3, 64, 4, 2, 16, 5),
]
# The same for multi-head families; "batch == kv_heads" is batch == heads == 2 there.
MHA_SIZES = [
    Sizes("distinct", 3, 7, 4, 4, 16, 5),
    Sizes("batch=seq=head_dim", 8, 8, 4, 4, 8, 8),
    Sizes("batch=kv_heads", 2, 7, 2, 2, 32, 5),
    Sizes("seq=d_model", 3, 64, 4, 4, 16, 5),
]


def llama(s: Sizes, impl="eager", layers=1, vocab=VOCAB, ffn=96):
    cfg = T.LlamaConfig(
        vocab_size=vocab,
        hidden_size=s.hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        max_position_embeddings=256,
    )
    return T.LlamaForCausalLM._from_config(cfg, attn_implementation=impl)


def gpt2(s: Sizes, impl="eager", layers=1):
    cfg = T.GPT2Config(
        vocab_size=VOCAB, n_embd=s.hidden, n_layer=layers, n_head=s.heads, n_positions=256
    )
    return T.GPT2LMHeadModel._from_config(cfg, attn_implementation=impl)


def bert(s: Sizes, impl="eager", layers=1, cls=T.BertModel, **extra):
    cfg = T.BertConfig(
        vocab_size=VOCAB,
        hidden_size=s.hidden,
        num_hidden_layers=layers,
        num_attention_heads=s.heads,
        intermediate_size=96,
        max_position_embeddings=256,
        **extra,
    )
    return cls._from_config(cfg, attn_implementation=impl)


def t5(s: Sizes, impl="eager"):
    cfg = T.T5Config(
        vocab_size=VOCAB,
        d_model=s.hidden,
        d_kv=s.head_dim,
        d_ff=96,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=s.heads,
    )
    return T.T5Model._from_config(cfg, attn_implementation=impl)


# The attention module of the first layer of each family, and its Q/K/V projections.
ATTENTION = {
    "llama": ("layers.0.self_attn", ("q_proj", "k_proj", "v_proj")),
    "bert": ("layer.0.attention.self", ("query", "key", "value")),
    "t5": ("encoder.block.0.layer.0.SelfAttention", ("q", "k", "v")),
}


def _projections(t, family):
    """The Q, K and V projections' outputs, in that order."""
    if family == "gpt2":  # one Conv1D for all three, then a split
        split = next(ev for ev in t.events if ev.op == "split" and ev.module.endswith("h.0.attn"))
        return list(split.outputs)
    module, names = ATTENTION[family]
    return [_out(t, "linear", f"{module}.{name}")[0] for name in names]


def _build(family, s, impl):
    model = {"llama": llama, "gpt2": gpt2, "bert": bert, "t5": t5}[family](s, impl)
    kwargs = {"attention_mask": _ones(s.batch, s.seq)}
    if family == "t5":
        kwargs["decoder_input_ids"] = _ids(s.batch, s.dec_seq, seed=1)
    return model, (_ids(s.batch, s.seq),), kwargs


def _grid():
    for family in ("llama", "gpt2", "bert", "t5"):
        for s in GQA_SIZES if family == "llama" else MHA_SIZES:
            for impl in ("eager", "sdpa"):
                yield pytest.param(family, s, impl, id=f"{family}-{impl}-{s.id}")


def _split_module(family):
    return {"gpt2": "h.0.attn"}.get(family) or ATTENTION[family][0]


# -- 1. token ids name batch and seq ------------------------------------------------------------
def _prefix(named_shape):
    """A named shape without its last axis (the features, named per family)."""
    return named_shape.rsplit(", ", 1)[0] + ", ...]"


def _token_names(t, family, s, impl):
    """What the first layer's attention reads, and what it should read, as two dicts."""
    B, S, H, KV, D = s.batch, s.seq, s.heads, s.kv_heads, s.head_dim
    kv = "kv_heads" if KV < H else "heads"
    got, want = {"findings": _kinds(t)}, {"findings": []}
    for r, role in zip(_projections(t, family), ("Q", "K", "V"), strict=True):
        got[f"{role} projection"] = (r.role, _prefix(r.named_shape))
        want[f"{role} projection"] = (role, f"[batch={B}, seq={S}, ...]")
    module = _split_module(family)
    splits = _head_splits(t, module)
    for role in ("Q", "K", "V"):
        heads = ("heads", H) if role == "Q" else (kv, KV)
        view, moved = splits.get(role, (None, None))
        got[f"{role} head split"] = view and view.named_shape
        got[f"{role} transposed"] = moved and moved.named_shape
        want[f"{role} head split"] = f"[batch={B}, seq={S}, {heads[0]}={heads[1]}, d_k={D}]"
        want[f"{role} transposed"] = f"[batch={B}, {heads[0]}={heads[1]}, seq={S}, d_k={D}]"
    if impl == "eager":
        # The query-key product and the elementwise ops on it (scaling, mask add).
        scores = [r for ev in t.events if module in ev.module for r in ev.outputs]
        scores = [r for r in scores if r.role == "scores"]
        got["scores"] = sorted(set(_named(scores)))
        want["scores"] = [f"[batch={B}, heads={H}, seq_q={S}, seq_k={S}]"]
        if family != "t5":  # T5's last query-key product is the cross-attention's
            got["shape_of(scores)"] = t.shape_of("scores")
            want["shape_of(scores)"] = (B, H, S, S)
    else:
        contexts = _out(t, "scaled_dot_product_attention", module)
        got["sdpa context"] = [(r.role, r.named_shape) for r in contexts]
        want["sdpa context"] = [("context", f"[batch={B}, heads={H}, seq={S}, d_k={D}]")]
    return got, want


@pytest.mark.parametrize(("family", "s", "impl"), list(_grid()))
def test_token_id_models_name_batch_and_seq(family, s, impl):
    model, args, kwargs = _build(family, s, impl)
    got, want = _token_names(_trace(model, *args, **kwargs), family, s, impl)
    assert got == want


def _first(t, op, module_part):
    """The named shape of the first output of `op` inside `module_part` (None: no such op)."""
    found = _out(t, op, module_part)
    return found[0].named_shape if found else None


def test_token_id_prompt_as_long_as_head_dim():
    """A 128-token prompt into head_dim 128 (Llama-2/3 sized heads), one layer, batch 3."""
    s = Sizes("prompt=head_dim", 3, 128, 8, 2, 128, 0)
    got, want = {}, {}
    for impl in ("eager", "sdpa"):
        t = _trace(llama(s, impl, ffn=64), _ids(3, 128), attention_mask=_ones(3, 128))
        splits = _head_splits(t, "layers.0.self_attn")
        cos = [r for r in _out(t, "unsqueeze", "layers.0.self_attn") if r.label == "cos"]
        got[impl] = {
            "findings": _kinds(t),
            "Q": splits["Q"][1].named_shape,
            "K": splits["K"][1].named_shape,
            # The rotary table: positions along seq, frequencies along d_k.
            "cos": cos[0].named_shape,
            "scores": sorted(set(_named(t.records("scores")))),
        }
        want[impl] = {
            "findings": [],
            "Q": "[batch=3, heads=8, seq=128, d_k=128]",
            "K": "[batch=3, kv_heads=2, seq=128, d_k=128]",
            "cos": "[1, 1, seq=128, d_k=128]",
            "scores": ["[batch=3, heads=8, seq_q=128, seq_k=128]"] if impl == "eager" else [],
        }
    assert got == want


def test_token_ids_alone_name_batch():
    """No attention_mask: Llama builds its causal mask by broadcasting ([1, 1, S, S]
    expanded to the batch), BERT its token_type_ids from a [1, max_len] buffer expanded
    to the batch; a broadcast copy lined up with the batch must not take its name away."""
    t = _trace(llama(GQA_SIZES[0]), _ids(3, 7))
    t_bert = _trace(bert(MHA_SIZES[0]), _ids(3, 7))
    got = {
        "llama Q": _first(t, "linear", "self_attn.q_proj"),
        "llama K": _first(t, "linear", "self_attn.k_proj"),
        "llama scores": _named(t.records("scores"))[:1],
        "bert embedding": _first(t_bert, "embedding", "embeddings.word_embeddings"),
        "bert Q": _first(t_bert, "linear", "attention.self.query"),
    }
    assert got == {
        "llama Q": "[batch=3, seq=7, d_model=64]",
        "llama K": "[batch=3, seq=7, 32]",
        "llama scores": ["[batch=3, heads=4, seq_q=7, seq_k=7]"],
        "bert embedding": "[batch=3, seq=7, d_model=64]",
        "bert Q": "[batch=3, seq=7, d_model=64]",
    }


def _either(got, *allowed):
    """`got` when it is one of `allowed` (names that are both right), else the first."""
    return got if got in allowed else allowed[0]


def _exact(t, op, module):
    found = [r for ev in t.events if ev.op == op and ev.module == module for r in ev.outputs]
    return found[0].named_shape if found else None


def test_later_layers_read_seq_too():
    """Self-attention positions are queries and keys. The context (attn @ V) may read
    them as the queries (seq_q); once the residual stream adds it back they are the
    sequence again: the residual, the next layer's K projection and the logits read
    `seq`, never `seq_q`."""
    t = _trace(llama(GQA_SIZES[0], layers=2), _ids(3, 7), attention_mask=_ones(3, 7))
    t_bert = _trace(bert(MHA_SIZES[0], layers=2), _ids(3, 7), attention_mask=_ones(3, 7))
    o_proj = _first(t, "linear", "layers.0.self_attn.o_proj")
    got = {
        "llama o_proj": o_proj,
        "llama residual": _exact(t, "add", "model.layers.0"),
        "llama layer 1 K": _first(t, "linear", "layers.1.self_attn.k_proj"),
        "llama logits": _first(t, "linear", "lm_head"),
        "bert residual": _exact(t_bert, "add", "encoder.layer.0.attention.output"),
        "bert layer 1 K": _first(t_bert, "linear", "layer.1.attention.self.key"),
    }
    assert got == {
        "llama o_proj": _either(
            o_proj, "[batch=3, seq=7, d_model=64]", "[batch=3, seq_q=7, d_model=64]"
        ),
        "llama residual": "[batch=3, seq=7, d_model=64]",
        "llama layer 1 K": "[batch=3, seq=7, 32]",
        "llama logits": "[batch=3, seq=7, 100]",
        "bert residual": "[batch=3, seq=7, d_model=64]",
        "bert layer 1 K": "[batch=3, seq=7, d_model=64]",
    }


def test_cross_attention_keys_are_the_encoder_positions():
    """T5: the decoder's positions are the cross-attention's queries, the encoder's its
    keys. Neither side may read as the other, and the decoder's batch is the batch."""
    got, want = {}, {}
    cross = "decoder.block.0.layer.1.EncDecAttention"
    for impl in ("eager", "sdpa"):
        model, args, kwargs = _build("t5", MHA_SIZES[0], impl)
        t = _trace(model, *args, **kwargs)
        q, k = _first(t, "linear", f"{cross}.q"), _first(t, "linear", f"{cross}.k")
        splits = _head_splits(t, "decoder.block.0.layer.0.SelfAttention")
        got[impl] = {
            "findings": _kinds(t),
            "cross Q": q,
            "cross K": k,
            "cross scores": sorted(
                {r.named_shape for r in t.records("scores") if r.shape == (3, 4, 5, 7)}
            ),
            "decoder Q head split": splits["Q"][0].named_shape,
            "decoder K head split": splits["K"][0].named_shape,
        }
        # Either name is right for a sequence that also attends to itself; the other
        # side's is wrong.
        want[impl] = {
            "findings": [],
            "cross Q": _either(q, "[batch=3, seq=5, d_model=64]", "[batch=3, seq_q=5, d_model=64]"),
            "cross K": _either(k, "[batch=3, seq=7, d_model=64]", "[batch=3, seq_k=7, d_model=64]"),
            "cross scores": ["[batch=3, heads=4, seq_q=5, seq_k=7]"] if impl == "eager" else [],
            "decoder Q head split": "[batch=3, seq=5, heads=4, d_k=16]",
            "decoder K head split": "[batch=3, seq=5, heads=4, d_k=16]",
        }
    assert got == want


# -- 2. roles -----------------------------------------------------------------------------------
PRODUCTS = frozenset({"matmul", "bmm", "baddbmm", "einsum", "__matmul__", "__rmatmul__"})
SOFTMAX = frozenset({"softmax", "_softmax"})
ATTENTION_MODULES = ("attn", "attention", "SelfAttention", "EncDecAttention")
HEADS = ("lm_head", "classifier", "score")


def _role_violations(t):
    """Records whose role `scores` or `attn` does not follow from the data flow."""
    bad = []
    for ev in t.events:
        in_roles = {r.role for r in ev.inputs}
        for r in ev.outputs:
            where = f"{ev.index} {ev.op} {r.label} {r.named_shape} in {ev.module or '<root>'}"
            if r.role == "scores":
                product = ev.op in PRODUCTS and {"Q", "K"} <= in_roles
                elementwise = "scores" in in_roles and any(
                    i.role == "scores" and i.shape == r.shape for i in ev.inputs
                )
                if not (product or elementwise):
                    bad.append(f"scores: {where} (inputs {sorted(map(str, in_roles))})")
                elif not any(part in ev.module for part in ATTENTION_MODULES):
                    bad.append(f"scores outside attention: {where}")
            elif r.role == "attn":
                softmax = ev.op in SOFTMAX and "scores" in in_roles
                kept = any(i.role == "attn" and i.shape == r.shape for i in ev.inputs)
                if not (softmax or kept):
                    bad.append(f"attn: {where} (inputs {sorted(map(str, in_roles))})")
    return bad


def _mixtral(hidden, heads, kv_heads, experts, impl="eager", ffn=96):
    cfg = T.MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        num_local_experts=experts,
        num_experts_per_tok=2,
    )
    return T.MixtralForCausalLM._from_config(cfg, attn_implementation=impl)


ROLE_MODELS = {
    "llama": lambda: (llama(GQA_SIZES[0]), (_ids(3, 7),), {"attention_mask": _ones(3, 7)}),
    "llama-coincident": lambda: (llama(GQA_SIZES[1]), (_ids(8, 8),), {}),
    "gpt2": lambda: (gpt2(MHA_SIZES[0]), (_ids(3, 7),), {"attention_mask": _ones(3, 7)}),
    # 4 experts == 4 heads (the report's grid).
    "mixtral": lambda: (_mixtral(64, 4, 2, 4), (_ids(3, 7),), {"attention_mask": _ones(3, 7)}),
    "bert-token-classifier": lambda: (
        bert(MHA_SIZES[0], cls=T.BertForTokenClassification, num_labels=4),
        (_ids(3, 7),),
        {"attention_mask": _ones(3, 7)},
    ),
    "llama-token-classifier": lambda: (
        T.LlamaForTokenClassification._from_config(
            T.LlamaConfig(
                vocab_size=VOCAB,
                hidden_size=64,
                intermediate_size=96,
                num_hidden_layers=1,
                num_attention_heads=4,
                num_key_value_heads=2,
                num_labels=7,  # == seq
            ),
            attn_implementation="eager",
        ),
        (_ids(3, 7),),
        {"attention_mask": _ones(3, 7)},
    ),
}


@pytest.mark.parametrize("name", list(ROLE_MODELS))
def test_scores_and_attn_only_where_the_data_flow_puts_them(name):
    model, args, kwargs = ROLE_MODELS[name]()
    t = _trace(model, *args, **kwargs)
    assert _kinds(t) == []
    assert _role_violations(t) == []
    products = [r for ev in t.events if ev.op in PRODUCTS for r in ev.outputs if r.role == "scores"]
    assert products, "no query-key product was given the role scores"
    # shape_of("scores") is the query-key product's, never the logits'.
    assert t.shape_of("scores") == products[-1].shape
    assert len(t.shape_of("scores")) == 4
    assert t.shape_of("attn") == products[-1].shape
    # The model's head (LM logits, token-classifier logits) is no attention tensor.
    head = [r for ev in t.events if ev.module in HEADS for r in ev.outputs]
    assert head, "no head module in the trace"
    assert {r.role for r in head} & {"scores", "attn"} == set()
    # A router's softmax is not attention.
    for ev in t.events:
        if ev.module.endswith("mlp.gate"):
            assert {r.role for r in ev.outputs} & {"scores", "attn"} == set(), ev


# -- 3. images and audio ------------------------------------------------------------------------
def _vision(t, q_proj):
    conv = next(ev for ev in t.events if ev.op == "conv2d")
    return {
        "findings": _kinds(t),
        "pixels": conv.inputs[0].named_shape,
        "patches": conv.outputs[0].named_shape,
        "Q": _first(t, "linear", q_proj),
        "scores": _named(t.records("scores"))[:1],
    }


def _vit(image, patch):
    cfg = T.ViTConfig(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=96,
        image_size=image,
        patch_size=patch,
    )
    return T.ViTModel._from_config(cfg, attn_implementation="eager")


def test_vit_names_channels_height_width():
    t = _trace(_vit(32, 8), torch.randn(3, 3, 32, 32))
    assert _vision(t, "layers.0.attention.q_proj") == {
        "findings": [],
        "pixels": "[batch=3, channels=3, height=32, width=32]",
        "patches": "[batch=3, d_model=64, height=4, width=4]",
        "Q": "[batch=3, seq=17, d_model=64]",
        "scores": ["[batch=3, heads=4, seq_q=17, seq_k=17]"],
    }


def test_vit_patch_grid_as_wide_as_the_heads():
    """A 4x4 patch grid with 4 heads and batch 4 (CLIP ViT-L/14 at 224 px: a 16x16 grid,
    16 heads)."""
    t = _trace(_vit(16, 4), torch.randn(4, 3, 16, 16))
    assert _vision(t, "layers.0.attention.q_proj") == {
        "findings": [],
        "pixels": "[batch=4, channels=3, height=16, width=16]",
        "patches": "[batch=4, d_model=64, height=4, width=4]",
        "Q": "[batch=4, seq=17, d_model=64]",
        "scores": ["[batch=4, heads=4, seq_q=17, seq_k=17]"],
    }


def test_clip_vision_tower_names_channels_height_width():
    cfg = T.CLIPVisionConfig(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=96,
        image_size=32,
        patch_size=8,
    )
    model = T.CLIPVisionModel._from_config(cfg, attn_implementation="eager")
    t = _trace(model, torch.randn(3, 3, 32, 32))
    assert _vision(t, "layers.0.self_attn.q_proj") == {
        "findings": [],
        "pixels": "[batch=3, channels=3, height=32, width=32]",
        "patches": "[batch=3, d_model=64, height=4, width=4]",
        "Q": "[batch=3, seq=17, d_model=64]",
        "scores": ["[batch=3, heads=4, seq_q=17, seq_k=17]"],
    }


def test_whisper_mel_bins_are_channels_frames_are_positions():
    cfg = T.WhisperConfig(
        vocab_size=VOCAB,
        d_model=64,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=96,
        decoder_ffn_dim=96,
        num_mel_bins=20,
        max_source_positions=15,
        max_target_positions=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    model = T.WhisperModel._from_config(cfg, attn_implementation="eager")
    t = _trace(model, torch.randn(3, 20, 30), decoder_input_ids=_ids(3, 5))
    conv1, conv2 = [ev for ev in t.events if ev.op == "conv1d"]
    features = conv1.inputs[0]
    assert features.label == "input_features"
    enc = _head_splits(t, "encoder.layers.0.self_attn")
    cross_k = _first(t, "linear", "decoder.layers.0.encoder_attn.k_proj")
    got = {
        "findings": _kinds(t),
        # The mel bins are the conv's channels; the frames its positions (named, whatever
        # the name: seq for a 1-D conv).
        "features": (features.axes[:2], features.axes[2] is not None),
        "conv1": (conv1.outputs[0].axes[:2], conv1.outputs[0].axes[2] is not None),
        "conv2": conv2.outputs[0].named_shape,
        "encoder Q": enc["Q"][0].named_shape,
        "encoder K": enc["K"][0].named_shape,
        "encoder scores": sorted(
            {r.named_shape for r in t.records("scores") if r.shape == (3, 4, 15, 15)}
        ),
        "cross scores": sorted(
            {r.named_shape for r in t.records("scores") if r.shape == (3, 4, 5, 15)}
        ),
        "decoder Q": _first(t, "linear", "decoder.layers.0.self_attn.q_proj"),
        # The cross-attention's keys are the encoder's positions.
        "cross K": cross_k,
    }
    assert got == {
        "findings": [],
        "features": (("batch", "channels"), True),
        "conv1": (("batch", "d_model"), True),
        "conv2": "[batch=3, d_model=64, seq=15]",
        "encoder Q": "[batch=3, seq=15, heads=4, d_k=16]",
        "encoder K": "[batch=3, seq=15, heads=4, d_k=16]",
        "encoder scores": ["[batch=3, heads=4, seq_q=15, seq_k=15]"],
        "cross scores": ["[batch=3, heads=4, seq_q=5, seq_k=15]"],
        "decoder Q": "[batch=3, seq=5, d_model=64]",
        "cross K": _either(
            cross_k, "[batch=3, seq=15, d_model=64]", "[batch=3, seq_k=15, d_model=64]"
        ),
    }


# -- 4. the field report's reproducers ----------------------------------------------------------
def _r2_build(hidden, heads, kv):
    cfg = T.LlamaConfig(
        vocab_size=100,
        hidden_size=hidden,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=64,
    )
    return T.LlamaForCausalLM._from_config(cfg, attn_implementation="eager").eval()


def _r2_rows(t):
    """r2_names.py's table: (op, label, role, named shape) of its rows."""
    rows = []
    for ev in t.events:
        r = ev.outputs[0] if ev.outputs else None
        if r is None:
            continue
        if ev.op in ("matmul", "softmax", "linear"):
            rows.append((ev.op, r.label, r.role, r.named_shape))
    return rows


def _r2_expected(B, S, H, KV, D, hidden):
    kv = "kv_heads" if KV < H else "heads"
    return [
        ("linear", "query_states", "Q", f"[batch={B}, seq={S}, d_model={hidden}]"),
        ("linear", "key_states", "K", f"[batch={B}, seq={S}, {KV * D}]"),
        ("linear", "value_states", "V", f"[batch={B}, seq={S}, {KV * D}]"),
        ("matmul", "attn_weights", "scores", f"[batch={B}, heads={H}, seq_q={S}, seq_k={S}]"),
        ("softmax", "attn_weights", "attn", f"[batch={B}, heads={H}, seq_q={S}, seq_k={S}]"),
        ("matmul", "attn_output", "context", f"[batch={B}, heads={H}, seq={S}, d_k={D}]"),
        ("linear", "attn_output", "context", f"[batch={B}, seq={S}, d_model={hidden}]"),
        ("linear", "logits", None, f"[batch={B}, seq={S}, 100]"),
    ], kv


R2_BLOCKS = [
    # (what, hidden, heads, kv, input, B, S, head_dim)
    ("input_ids [3, 7]", 64, 4, 2, "ids", 3, 7, 16),
    ("inputs_embeds [3, 7, 64]", 64, 4, 2, "embeds", 3, 7, 16),
    ("input_ids [8, 8], d_k 8", 32, 4, 2, "ids", 8, 8, 8),
    ("input_ids [2, 7], kv_heads 2", 64, 4, 2, "ids", 2, 7, 16),
]


@pytest.mark.parametrize(
    ("hidden", "heads", "kv", "kind", "B", "S", "D"),
    [pytest.param(*b[1:], id=b[0]) for b in R2_BLOCKS],
)
def test_r2_names(hidden, heads, kv, kind, B, S, D):
    torch.manual_seed(0)
    m = _r2_build(hidden, heads, kv)
    if kind == "ids":
        t = _trace(m, torch.randint(0, 100, (B, S)))
    else:
        t = _trace(m, inputs_embeds=torch.randn(B, S, hidden))
    expected, kv_name = _r2_expected(B, S, heads, kv, D, hidden)
    rows = [row for row in _r2_rows(t) if row[1] in {e[1] for e in expected}]

    def allowed(want, got):
        # The context may read its rows as the queries (seq_q) or as the sequence (seq).
        if want[2] != "context" or got is None or got[:3] != want[:3]:
            return want
        return (*want[:3], _either(got[3], want[3], want[3].replace(f"seq={S}", f"seq_q={S}")))

    expected = [allowed(w, rows[i] if i < len(rows) else None) for i, w in enumerate(expected)]
    # The causal mask laid over the scores.
    masks = [
        r.named_shape
        for ev in t.events
        if ev.op == "expand" and "masking_utils" in ev.location
        for r in ev.outputs
    ]
    splits = _head_splits(t, "layers.0.self_attn")
    got = {
        "findings": _kinds(t),
        "rows": rows,
        "mask": masks,
        "shape_of": (t.shape_of("scores"), t.shape_of("attn")),
        # GQA: K and V heads before the repeat are kv_heads.
        "K": splits["K"][1].named_shape,
    }
    assert got == {
        "findings": [],
        "rows": expected,
        # Built before any scores exist, from one position range: both axes are the
        # sequence (the tutorial's [batch, 1, seq, seq]), not yet the scores' seq_q/seq_k.
        "mask": [f"[batch={B}, 1, seq={S}, seq={S}]"],
        "shape_of": ((B, heads, S, S), (B, heads, S, S)),
        "K": f"[batch={B}, {kv_name}={kv}, seq={S}, d_k={D}]",
    }


def test_r3b_rotary_prompt_of_head_dim_tokens():
    torch.manual_seed(0)
    cfg = T.LlamaConfig(
        vocab_size=1000,
        hidden_size=1024,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=8,
        num_key_value_heads=2,
    )  # head_dim = 1024 / 8 = 128
    model = T.LlamaForCausalLM(cfg).eval()
    for seq in (127, 128):
        t = _trace(model, torch.randint(0, 1000, (1, seq)))
        assert _kinds(t) == [], seq
        q_rot = next(ev for ev in t.events if ev.op == "mul" and ev.label == "q_embed")
        assert [r.named_shape for r in q_rot.inputs] == [
            f"[1, heads=8, seq={seq}, d_k=128]",
            f"[1, 1, seq={seq}, d_k=128]",
        ]
    with torch.no_grad():
        shapeguard.trace(model, torch.randint(0, 1000, (1, 128)), strict=True)  # no raise


R3_MODELS = {
    "llama": lambda impl: T.LlamaForCausalLM._from_config(
        T.LlamaConfig(
            vocab_size=100,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
        ),
        attn_implementation=impl,
    ),
    "gptj": lambda impl: T.GPTJForCausalLM._from_config(
        T.GPTJConfig(vocab_size=100, n_embd=64, n_layer=1, n_head=4, rotary_dim=8, n_positions=64),
        attn_implementation=impl,
    ),
    "gpt_neox": lambda impl: T.GPTNeoXForCausalLM._from_config(
        T.GPTNeoXConfig(
            vocab_size=100,
            hidden_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            intermediate_size=96,
            rotary_pct=0.5,
        ),
        attn_implementation=impl,
    ),
}


@pytest.mark.parametrize("name", list(R3_MODELS))
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_r3_rotary_at_seq_equal_head_dim(name, impl):
    """seq == head_dim (16) with batch distinct, batch == head_dim alone, and both."""
    model = R3_MODELS[name](impl).eval()
    got, want = {}, {}
    for b, s in [(3, 16), (16, 7), (16, 16)]:
        t = _trace(model, torch.randint(0, 100, (b, s)))
        if impl == "eager":
            names = sorted(set(_named(t.records("scores"))))
            expected = [f"[batch={b}, heads=4, seq_q={s}, seq_k={s}]"]
        else:
            sdpa = [ev for ev in t.events if ev.op == "scaled_dot_product_attention"]
            names = [r.named_shape for r in sdpa[0].inputs[:1]]
            expected = [f"[batch={b}, heads=4, seq={s}, d_k=16]"]
        got[b, s] = (_kinds(t), names)
        want[b, s] = ([], expected)
    assert got == want


def test_r4b_mixtral_real_head_counts():
    """Mixtral-8x7B's counts: hidden 4096, 32 heads, 8 kv heads, 8 experts (== kv heads).
    The router's softmax over the experts is no attention softmax."""
    torch.manual_seed(0)
    cfg = T.MixtralConfig(
        vocab_size=100,
        hidden_size=4096,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_local_experts=8,
        num_experts_per_tok=2,
    )
    model = T.MixtralForCausalLM(cfg).eval()
    t = _trace(model, torch.randint(0, 100, (3, 7)))
    assert [f.kind for f in t.findings if f.kind == "softmax_axis"] == []
    assert _kinds(t) == []
    assert _role_violations(t) == []
    router = [ev for ev in t.events if ev.module.endswith("mlp.gate")]
    assert {ev.op for ev in router} >= {"linear", "softmax"}
    for ev in router:
        assert {r.role for r in ev.outputs} & {"scores", "attn"} == set(), (ev.op, ev.label)
    (logits,) = _out(t, "linear", "mlp.gate")
    assert logits.named_shape == "[batch*seq=21, 8]"  # experts: no heads or kv_heads name
    splits = _head_splits(t, "layers.0.self_attn")
    assert splits["K"][1].named_shape == "[batch=3, kv_heads=8, seq=7, d_k=128]"


R1_IDS = torch.randint(3, 100, (3, 7), generator=torch.Generator().manual_seed(0))


def _left_pad():
    left = torch.ones(3, 7, dtype=torch.long)
    left[0, :3] = 0
    left[1, :1] = 0
    return left


def _right_pad():
    right = torch.ones(3, 7, dtype=torch.long)
    right[0, -3:] = 0
    right[1, -1:] = 0
    return right


R1_MODELS = {
    "gpt2-eager": lambda: T.GPT2LMHeadModel._from_config(
        T.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=64),
        attn_implementation="eager",
    ),
    "gpt2-sdpa": lambda: T.GPT2LMHeadModel._from_config(
        T.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=64),
        attn_implementation="sdpa",
    ),
    "gpt-neo-eager": lambda: T.GPTNeoForCausalLM._from_config(
        T.GPTNeoConfig(
            vocab_size=100,
            hidden_size=64,
            num_layers=2,
            attention_types=[[["global", "local"], 1]],
            num_heads=4,
            intermediate_size=96,
            window_size=4,
        ),
        attn_implementation="eager",
    ),
    "llama-eager": lambda: llama(GQA_SIZES[0], "eager", layers=2),
    "llama-sdpa": lambda: llama(GQA_SIZES[0], "sdpa", layers=2),
}


@pytest.mark.parametrize("name", list(R1_MODELS))
def test_r1_left_padding_is_not_fully_masked(name):
    t = _trace(R1_MODELS[name](), R1_IDS, attention_mask=_left_pad())
    assert _kinds(t) == []


def test_r1_deberta_right_padding_is_not_fully_masked():
    """DeBERTa-v2 hides the pad tokens' own query rows (an outer-product mask): those rows
    are ignored downstream, as left padding's are."""
    model = T.DebertaV2Model(
        T.DebertaV2Config(
            vocab_size=100,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=96,
            relative_attention=True,
            position_buckets=8,
            pos_att_type=["p2c", "c2p"],
        )
    )
    t = _trace(model, R1_IDS, attention_mask=_right_pad())
    assert _kinds(t) == []


# -- 5. records settle when the trace closes ----------------------------------------------------
class CrossAttention(nn.Module):
    """Token ids in, the queries' positions first used before any attention names them."""

    def __init__(self, d_model=16):
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Embedding(VOCAB, d_model)
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)

    def forward(self, tokens, memory_tokens):
        x = self.embed(tokens)
        x = x * 2.0  # recorded before the attention says these are queries
        memory = self.embed(memory_tokens)
        q, k, v = self.q(x), self.k(memory), self.v(memory)
        scores = q @ k.transpose(-2, -1) / 4.0
        attn = scores.softmax(dim=-1)
        return attn @ v


def test_records_settle_to_names_learned_later():
    t = _trace(CrossAttention(), _ids(3, 5), _ids(3, 7, seed=1))
    assert _kinds(t) == []
    doubled = next(ev for ev in t.events if ev.op == "mul")
    assert doubled.outputs[0].named_shape == "[batch=3, seq_q=5, d_model=16]"
    embeds = [ev for ev in t.events if ev.op == "embedding"]
    assert [ev.outputs[0].named_shape for ev in embeds] == [
        "[batch=3, seq_q=5, d_model=16]",
        "[batch=3, seq_k=7, d_model=16]",
    ]
    assert embeds[0].inputs[0].named_shape == "[batch=3, seq_q=5]"  # the token ids themselves
    scores = t.records("scores")  # the product and its scaling
    assert _named(scores) == ["[batch=3, seq_q=5, seq_k=7]"] * 2
    # Every record is settled: its axes are the final ones, and the JSON says the same.
    data = json.loads(t.to_json())
    for ev, jev in zip(t.events, data["events"], strict=True):
        for r, jr in zip(ev.outputs, jev["outputs"], strict=True):
            assert r.meta is None
            assert jr["axes"] == list(r.axes)
        for r, jr in zip(ev.inputs, jev["inputs"], strict=True):
            assert jr["axes"] == list(r.axes)
    position = t.events.index(doubled)
    assert data["events"][position]["outputs"][0]["axes"] == ["batch", "seq_q", "d_model"]


def test_json_carries_the_settled_names_of_a_real_model():
    model, args, kwargs = _build("t5", MHA_SIZES[0], "eager")
    t = _trace(model, *args, **kwargs)
    data = json.loads(t.to_json())
    assert len(data["events"]) == len(t.events)
    for ev, jev in zip(t.events, data["events"], strict=True):
        for r, jr in zip((*ev.inputs, *ev.outputs), (*jev["inputs"], *jev["outputs"]), strict=True):
            assert jr["axes"] == list(r.axes)
            assert jr["role"] == r.role
    # The decoder's embedding, recorded before its cross-attention: the final names.
    (dec,) = _out(t, "embedding", "decoder.embed_tokens")
    jdec = data["events"][next(i for i, ev in enumerate(t.events) if dec in ev.outputs)]
    assert jdec["outputs"][0]["axes"] == list(dec.axes)
    assert dec.axes[0] == "batch"
    assert dec.axes[1] in ("seq", "seq_q")


def test_values_split_from_a_fused_projection_are_named_by_attention():
    """nanoGPT's c_attn(x).split(C, dim=2): V takes part in no query-key product, so
    attn @ V is what names its head split (heads, d_k), as the product names K's."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parent / "cli_models" / "token_lm.py"
    spec = importlib.util.spec_from_file_location("token_lm_for_provenance", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    t = _trace(module.TinyLM(), _ids(2, 5))
    values = [
        r.named_shape for ev in t.events for r in ev.outputs if r.role == "V" and ev.op == "view"
    ]
    context = [
        r.named_shape
        for ev in t.events
        if ev.op == "matmul"
        for r in ev.outputs
        if r.role == "context"
    ]
    assert values == ["[batch=2, seq=5, heads=4, d_k=12]"]
    assert context == ["[batch=2, heads=4, seq_q=5, d_k=12]"]


class _Rotate(nn.Module):
    """A function dressed as a module and kept out of the tree, as the `kernels` package
    wraps transformers' `apply_rotary_pos_emb` (held in a plain dict, never registered)."""

    def forward(self, x):
        return torch.cat((-x[..., 1::2], x[..., ::2]), dim=-1)


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.__dict__["_funcs"] = {"rotate": _Rotate()}

    def forward(self, x):
        return self._funcs["rotate"](self.proj(x))


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = _Block()

    def forward(self, x):
        return self.block(x)


def test_a_module_called_outside_the_tree_is_its_callers_function():
    """Its ops are recorded under the module that called it, as a plain function's are:
    transformers 5.25 with `kernels` installed runs every Llama's rotary this way."""
    t = _trace(_Model(), torch.randn(3, 5, 8))
    cat = [ev for ev in t.events if ev.op == "cat"]
    assert [(ev.module, ev.module_type) for ev in cat] == [("block", "_Block")]
    # Alone (the first module run), it stands for itself.
    alone = _trace(_Rotate(), torch.randn(3, 5, 8))
    assert [ev.module_type for ev in alone.events if ev.op == "cat"] == ["_Rotate"]
