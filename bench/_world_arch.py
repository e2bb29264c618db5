"""One transformers architecture through every setting of the world corpus.

Settings: attention implementation (`-` the default; `e` eager where the default is not
eager, at sizes d and c), sizes (d, c, a; r for the REALISTIC decoders, default
implementation), padding (n, l, r for models that take a mask; audio n and r). A setting
that does not build, or whose plain forward fails, is recorded and skipped; a failure at the
first setting (`-d`, no padding) means the architecture was not built.
"""

import time
import warnings

import _world_fixes as fixes
import torch
from _world_build import adapt, build, default_impl
from _world_inputs import make, pad_id, takes_mask
from _world_runs import error_text, run_check, run_config, run_generate
from _world_sizes import PADDINGS, REALISTIC, SIZES, VISION_C

NO_ALL_EQUAL = ("vision", "video", "dual")


def _sizes_for(candidate, tag):
    if tag == "c" and candidate.kind in NO_ALL_EQUAL:
        return VISION_C
    return SIZES[tag]


def _paddings(candidate, model):
    if not takes_mask(model) and candidate.kind not in ("speech",):
        return ("n",)
    if candidate.kind in ("audio", "speech"):
        return ("n", "r")
    return PADDINGS


def _inputs(candidate, model, sizes, padding):
    generator = torch.Generator().manual_seed(1234)
    maker = fixes.INPUTS.get(candidate.model_type)
    if maker is not None:
        return maker(model, sizes, padding, generator)
    side = fixes.IMAGE_SIDE.get(candidate.model_type, sizes.image)
    return make(candidate, model, sizes, padding, generator, side)


def _first_forward(candidate, sizes, impl):
    """Build and run once; adapt the config from the error where it says what it wants."""
    model, config = build(candidate, sizes, impl)
    inputs = _inputs(candidate, model, sizes, "n")
    for _ in range(2):
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model(**inputs)
            return model
        except Exception as error:
            if not adapt(candidate, config, error):
                raise
            model = _rebuild(candidate, config, impl)
            inputs = _inputs(candidate, model, sizes, "n")
    return model


def _rebuild(candidate, config, impl):
    from _world_build import _instantiate

    return _instantiate(candidate, config, impl)


def settings(candidate, default):
    """[(impl tag, sizes tag)] in run order; impl tag '-' default, 'e' eager."""
    tags = ["d", "c"] + ([] if candidate.kind in NO_ALL_EQUAL else ["a"])
    out = [("-", t) for t in tags]
    if default != "eager":
        out += [("e", t) for t in ("d", "c")]
    if candidate.model_type in REALISTIC:
        out.append(("-", "r"))
    return out


def is_generator(candidate, model) -> bool:
    return candidate.kind == "decoder" and hasattr(model, "generate") and model.can_generate()


def run(candidate, *, discover=False) -> dict:
    """The result of one architecture (JSON-ready)."""
    start = time.perf_counter()
    result: dict = {"name": candidate.model_type, "source": "transformers", "kind": candidate.kind,
                    "class": candidate.class_name, "configs": {}}  # fmt: skip
    try:
        model = _first_forward(candidate, SIZES["d"], None)
    except Exception as error:
        result["status"] = "not built"
        result["error"] = error_text(error)
        return result
    result["status"] = "ok"
    default = default_impl(model)
    result["impl"] = default
    models = {("-", "d"): model}
    for impl_tag, size_tag in [("-", "d")] if discover else settings(candidate, default):
        sizes = _sizes_for(candidate, size_tag)
        key = (impl_tag, size_tag)
        if key not in models:
            try:
                models[key] = _first_forward(candidate, sizes, "eager" if impl_tag == "e" else None)
            except Exception as error:
                result["configs"][f"{impl_tag}{size_tag}"] = {"build_error": error_text(error)}
                continue
        current = models.pop(key)
        for padding in _paddings(candidate, current):
            tag = f"{impl_tag}{size_tag}{padding}"
            inputs = _inputs(candidate, current, sizes, padding)
            result["configs"][tag] = (
                {"plain_only": True}
                if discover
                else run_config(current, (), inputs, guard=size_tag == "d")
            )
        if key == ("-", "d"):
            models[key] = current
    if not discover:
        d_model = models[("-", "d")]
        if is_generator(candidate, d_model):
            inputs = _inputs(candidate, d_model, SIZES["d"], "l")
            result["generate"] = run_generate(d_model, inputs, pad_id(d_model.config))
        padding = "l" if candidate.kind == "decoder" else "r"
        if padding not in _paddings(candidate, d_model):
            padding = "n"
        result["check"] = run_check(d_model, (), _inputs(candidate, d_model, SIZES["d"], padding))
        result["check"]["padding"] = padding
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


def run_tags(candidate, tags, *, generate=False) -> dict:
    """Only the named settings (`-dl`, `ecr`, ...): the CI sample's slice of `run`."""
    result: dict = {"name": candidate.model_type, "configs": {}}
    models: dict = {}
    for tag in tags:
        impl_tag, size_tag, padding = tag
        sizes = _sizes_for(candidate, size_tag)
        key = (impl_tag, size_tag)
        if key not in models:
            models[key] = _first_forward(candidate, sizes, "eager" if impl_tag == "e" else None)
        model = models[key]
        if padding not in _paddings(candidate, model):
            padding = "n"
        inputs = _inputs(candidate, model, sizes, padding)
        result["configs"][f"{impl_tag}{size_tag}{padding}"] = run_config(model, (), inputs)
    if generate:
        model = models.get(("-", "d")) or _first_forward(candidate, SIZES["d"], None)
        if is_generator(candidate, model):
            inputs = _inputs(candidate, model, SIZES["d"], "l")
            result["generate"] = run_generate(model, inputs, pad_id(model.config))
    return result
