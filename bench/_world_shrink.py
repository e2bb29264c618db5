"""The generic shrink: a transformers config made tiny by its common size fields.

`shrink(config, sizes)` sets every common size field it finds in the config and in each of
its sub-configs (width, depth, heads, kv heads, head_dim, FFN width, vocabulary, positions,
experts, windows, MLA ranks, image and patch sizes), cuts per-layer lists to the new depth
(keeping a second kind where a pattern mixes kinds), moves special token ids into the small
vocabulary and fills None defaults. Fields are found by name only; a family the names do not
fit gets a fix in `_world_fixes.py`.
"""

import contextlib

WIDTH = (
    "hidden_size",
    "d_model",
    "n_embd",
    "dim",
    "embed_dim",
    "d_embed",
    "embedding_size",
    "attention_hidden_size",
    "projection_size",
    "cross_attention_hidden_size",
)
LAYERS = (
    "num_hidden_layers",
    "num_layers",
    "n_layer",
    "n_layers",
    "encoder_layers",
    "decoder_layers",
    "num_encoder_layers",
    "num_decoder_layers",
)
HEADS = (
    "num_attention_heads",
    "n_head",
    "n_heads",
    "num_heads",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "num_decoder_attention_heads",
    "index_n_heads",
    "linear_num_heads",
)
KV_HEADS = (
    "num_key_value_heads",
    "num_kv_heads",
    "n_kv_heads",
    "multi_query_group_num",
    "n_head_kv",
)
FFN = (
    "intermediate_size",
    "ffn_dim",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "d_ff",
    "n_inner",
    "hidden_dim",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "expert_intermediate_size",
    "ffn_hidden_size",
    "decoder_intermediate_size",
)
POSITIONS = ("max_position_embeddings", "n_positions", "n_ctx", "max_target_positions")
EXPERTS = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "moe_num_experts",
    "num_routed_experts",
)
EXPERTS_PER_TOKEN = ("num_experts_per_tok", "moe_topk", "num_selected_experts", "moe_k")
WINDOWS = ("sliding_window", "attention_window", "window_size", "local_window_size")
TOKEN_IDS = (
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "decoder_start_token_id",
    "sep_token_id",
    "cls_token_id",
    "mask_token_id",
    "unk_token_id",
    "forced_eos_token_id",
    "forced_bos_token_id",
    "image_token_id",
    "video_token_id",
)
VOCAB = 128
FFN_WIDTH = 96
EXPERTS_N, EXPERTS_K = 4, 2
WINDOW = 4
LAYERS_N = 2


def _set(config, name, value):
    with contextlib.suppress(AttributeError, TypeError, ValueError):
        setattr(config, name, value)


def _get(config, name, default=None):
    """getattr that also survives per-layer attributes (heterogeneous configs raise)."""
    try:
        return getattr(config, name, default)
    except Exception:
        return default


def _has(config, name):
    return name in getattr(config, "__dict__", {})


def sub_configs(config):
    """The config's sub-configs (text, vision, encoder, ...), as objects."""
    out = []
    for name in sorted(getattr(config, "sub_configs", {}) or {}):
        value = _get(config, name)
        if value is not None and hasattr(value, "to_dict"):
            out.append(value)
    return out


def _cut(values, n):
    """A per-layer list cut to n entries, keeping a second kind where it mixes kinds."""
    values = list(values)
    if len(values) <= n:
        return values
    out = [values[0]]
    others = [v for v in values[1:] if v != values[0]]
    if others and n > 1:
        out.append(others[0])
    while len(out) < n:
        out.append(values[len(out)])
    return out


def _shrink_lists(config, old_layers, layers):
    """Per-layer lists (`layer_types`, `mlp_only_layers`, ...) cut to the new depth."""
    for name, value in list(vars(config).items()):
        if name.startswith("_") or not isinstance(value, (list, tuple)) or not value:
            continue
        if name == "layer_types" or (
            old_layers and len(value) == old_layers and old_layers > layers
        ):
            _set(
                config,
                name,
                type(value)(_cut(value, layers))
                if isinstance(value, tuple)
                else _cut(value, layers),
            )
        elif name.endswith("_layers") and all(isinstance(v, int) for v in value):
            # Indices of special layers: keep those that still exist, at least one.
            kept = [v for v in value if v < layers] or [layers - 1]
            _set(config, name, kept)


def _widths(config, sizes):
    hidden = sizes.hidden
    old_heads = next(
        (v for n in HEADS if isinstance(v := _get(config, n), int) and _has(config, n)), None
    )
    for name in WIDTH:
        if isinstance(_get(config, name), int) and _has(config, name):
            _set(config, name, hidden)
    for name in HEADS:
        value = _get(config, name)
        if isinstance(value, int) and _has(config, name):
            _set(config, name, sizes.heads)
        elif isinstance(value, (list, tuple)) and value and _has(config, name):
            _set(config, name, [sizes.heads] * len(value))  # per stage (Swin)
    for name in KV_HEADS:
        value = _get(config, name)
        if isinstance(value, int) and _has(config, name):
            # Keep the model's kind: multi-query stays 1, multi-head stays as many as the
            # heads, grouped gets fewer than the heads.
            kind = 1 if value == 1 else sizes.heads if value == old_heads else sizes.kv_heads
            _set(config, name, kind)
        elif value is None and _has(config, name):
            _set(config, name, sizes.heads)
    if any(
        _has(config, n)
        for n in ("head_dim", "attention_head_dim", "index_head_dim", "linear_head_dim")
    ):
        for name in ("head_dim", "attention_head_dim", "index_head_dim", "linear_head_dim"):
            if _has(config, name):
                _set(config, name, sizes.head_dim)
    for name in FFN:
        value = _get(config, name)
        if isinstance(value, int) and _has(config, name):
            _set(config, name, FFN_WIDTH)
        elif isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            _set(config, name, [FFN_WIDTH] * len(value))  # per layer (Gemma-3n)
    # A partial rotary width in dims, at most the head's (GPT-J, CodeGen).
    if isinstance(_get(config, "rotary_dim"), int) and _has(config, "rotary_dim"):
        _set(config, "rotary_dim", sizes.head_dim // 2)


def _positions(config, sizes):
    for name in POSITIONS:
        if isinstance(_get(config, name), int) and _has(config, name):
            _set(config, name, max(128, 2 * sizes.seq))
    vocab = _get(config, "vocab_size")
    if _has(config, "vocab_size") and (isinstance(vocab, int) or vocab is None):
        _set(config, "vocab_size", VOCAB)
    for name in WINDOWS:
        value = _get(config, name)
        if isinstance(value, int) and value > 0 and _has(config, name):
            _set(config, name, WINDOW)
        elif isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            _set(config, name, [WINDOW] * len(value))


def _experts(config):
    for name in EXPERTS:
        value = _get(config, name)
        if (isinstance(value, int) and value > 1) or (value is None and _has(config, name)):
            _set(config, name, EXPERTS_N)
    for name in EXPERTS_PER_TOKEN:
        value = _get(config, name)
        if (isinstance(value, int) and value > EXPERTS_K) or (value is None and _has(config, name)):
            _set(config, name, EXPERTS_K)
    for name in ("n_group", "topk_group", "num_expert_group"):
        if isinstance(_get(config, name), int):
            _set(config, name, 1)
    for name in ("n_shared_experts", "num_shared_experts"):
        value = _get(config, name)
        if value is None and _has(config, name) or isinstance(value, int) and value > 1:
            _set(config, name, 1)
    for name in ("first_k_dense_replace", "first_k_dense", "num_dense_layers"):
        value = _get(config, name)
        if isinstance(value, int) and value >= LAYERS_N:
            _set(config, name, 1)


def _mla(config, sizes):
    """Multi-head latent attention ranks, scaled to head_dim."""
    d = sizes.head_dim
    for name, value in (
        ("qk_rope_head_dim", d // 2),
        ("qk_nope_head_dim", d // 2),
        ("v_head_dim", d),
        ("kv_lora_rank", 2 * d),
    ):
        if isinstance(_get(config, name), int) and _has(config, name):
            _set(config, name, value)
    if isinstance(_get(config, "q_lora_rank"), int):
        _set(config, "q_lora_rank", 2 * d)
    if isinstance(_get(config, "qk_head_dim"), int) and _has(config, "qk_nope_head_dim"):
        _set(config, "qk_head_dim", d)
    # Where MLA is, `head_dim` is the rotary part's width (DeepSeek-V2/V3 and their kin).
    if isinstance(_get(config, "qk_rope_head_dim"), int) and _has(config, "head_dim"):
        _set(config, "head_dim", d // 2)


def _image(config, sizes):
    if isinstance(_get(config, "image_size"), int):
        _set(config, "image_size", sizes.image)
    elif isinstance(_get(config, "image_size"), (list, tuple)):
        _set(config, "image_size", [sizes.image, sizes.image])
    if isinstance(_get(config, "patch_size"), int):
        _set(config, "patch_size", sizes.patch)
    elif isinstance(_get(config, "patch_size"), (list, tuple)):
        _set(config, "patch_size", [sizes.patch, sizes.patch])


def _token_ids(config):
    vocab = _get(config, "vocab_size")
    if not isinstance(vocab, int):
        return
    top = vocab - 1
    for name in TOKEN_IDS:
        value = _get(config, name)
        if isinstance(value, int) and value >= vocab:
            _set(config, name, top)
            top -= 1
        elif isinstance(value, list) and any(isinstance(v, int) and v >= vocab for v in value):
            _set(config, name, [v if v < vocab else vocab - 1 for v in value])


def _depth(config):
    old = None
    for name in LAYERS:
        value = _get(config, name)
        if isinstance(value, int) and value > LAYERS_N and _has(config, name):
            old = old or value
            _set(config, name, LAYERS_N)
    return old


def _per_layer_config(config, sizes):
    """`per_layer_config` ({"05": {...}, "11": {...}}) keeps one entry, on the last layer."""
    table = _get(config, "per_layer_config")
    if not isinstance(table, dict) or not table:
        return
    key, entry = next(iter(sorted(table.items())))
    entry = dict(entry) if isinstance(entry, dict) else entry
    if isinstance(entry, dict):
        for name in ("head_dim", "attention_head_dim"):
            if isinstance(entry.get(name), int):
                entry[name] = sizes.head_dim
        for name in KV_HEADS:
            if isinstance(entry.get(name), int) and entry[name] > 1:
                entry[name] = sizes.kv_heads
        for name in WINDOWS:
            if isinstance(entry.get(name), int):
                entry[name] = WINDOW
    _set(config, "per_layer_config", {str(LAYERS_N - 1).zfill(len(key)): entry})


def shrink_one(config, sizes):
    old_layers = _depth(config)
    _shrink_lists(config, old_layers, LAYERS_N)
    _widths(config, sizes)
    _positions(config, sizes)
    _experts(config)
    _mla(config, sizes)
    _image(config, sizes)
    _token_ids(config)
    _per_layer_config(config, sizes)


def shrink(config, sizes):
    """Shrink `config` and its sub-configs in place; return it."""
    shrink_one(config, sizes)
    for sub in sub_configs(config):
        shrink_one(sub, sizes)
        for subsub in sub_configs(sub):
            shrink_one(subsub, sizes)
    return config
