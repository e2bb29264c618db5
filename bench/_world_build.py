"""Build one transformers architecture from a tiny config: no weights, seeded."""

import re
import warnings

import _world_fixes as fixes
import torch
from _world_shrink import shrink, sub_configs

SEED = 0


def config_for(candidate, sizes):
    from transformers import AutoConfig

    config = AutoConfig.for_model(candidate.model_type)
    shrink(config, sizes)
    fix = fixes.FAMILY.get(candidate.model_type)
    if fix is not None:
        fix(config, sizes)
    return config


def _model_class(candidate):
    import transformers

    return getattr(transformers, candidate.class_name)


def _instantiate(candidate, config, impl):
    cls = _model_class(candidate)
    torch.manual_seed(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kwargs = {"attn_implementation": impl} if impl else {}
        model = cls._from_config(config, **kwargs)
    post = fixes.AFTER_BUILD.get(candidate.model_type)
    if post is not None:
        post(model)
    return model.eval()


def default_impl(model) -> str:
    return getattr(model.config, "_attn_implementation", None) or "eager"


def build(candidate, sizes, impl=None):
    """(model in eval mode, config). `impl` None is the model's default implementation."""
    config = config_for(candidate, sizes)
    return _instantiate(candidate, config, impl), config


def _mrope(config, total, section=None):
    """Scale `mrope_section` (or the model's default `section`) to the sum the model asks
    for (M-RoPE towers: Qwen2-VL, GLM-4V and the other `*_vl_text` towers)."""
    done = False
    for c in (config, *sub_configs(config)):
        holder = getattr(c, "rope_parameters", None)
        if not isinstance(holder, dict):
            continue
        current = holder.get("mrope_section") or section
        if isinstance(current, list) and current:
            base = [max(1, total * s // max(1, sum(current))) for s in current]
            base[0] += total - sum(base)
            holder["mrope_section"] = base
            done = True
    return done


def adapt(candidate, config, error: BaseException) -> bool:
    """Fix the config from the first forward's error, where the error says what it wants."""
    text = str(error)
    split = re.search(r"split_sizes to sum exactly to (\d+).*split_sizes=\[([\d, ]+)\]", text)
    if split:
        section = [int(v) for v in split.group(2).split(",")]
        return _mrope(config, int(split.group(1)), section)
    product = re.search(
        r"mat1 and mat2 shapes cannot be multiplied \(\d+x\d+ and (\d+)x\d+\)", text
    )
    if (
        product
        and candidate.model_type in fixes.FEATURE_INPUTS
        and not getattr(config, "world_feature_width", None)
    ):
        config.world_feature_width = int(product.group(1))
        return True
    wanted = re.search(
        r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)", text
    )
    return bool(wanted and _mrope(config, int(wanted.group(2)) // 2))
