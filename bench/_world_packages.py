"""Other packages users run, beside transformers: each a subject of the world corpus.

`PACKAGES[distribution] = (module to import, adapter factories)`. A package that is not
installed is reported as such; the `world` dependency group in pyproject.toml installs them
(`pip install --group world`; openai-whisper with `--no-deps`, see docs/world.md).
"""

import importlib
import importlib.metadata
import time

import _world_adapters as a
import _world_vision as vision
import torch
from _world_runs import error_text, run_check, run_config
from _world_sizes import SIZES

PACKAGES = {
    "torch": ("torch", (lambda: a._mha(True), lambda: a._mha(False), a._encoder, a._transformer)),
    "einops": ("einops", (a._einops_attention,)),
    "x-transformers": ("x_transformers", (a._xt_decoder, a._xt_encoder, a._xt_vit)),
    "local-attention": ("local_attention", (a._local_attention, a._local_transformer)),
    "perceiver-pytorch": ("perceiver_pytorch", (a._perceiver, a._perceiver_io)),
    "nystrom-attention": ("nystrom_attention", (a._nystrom,)),
    "linformer": ("linformer", (a._linformer,)),
    "performer-pytorch": ("performer_pytorch", (a._performer,)),
    "linear-attention-transformer": ("linear_attention_transformer", (a._linear_attention,)),
    "reformer-pytorch": ("reformer_pytorch", (a._reformer,)),
    "memory-efficient-attention-pytorch": (
        "memory_efficient_attention_pytorch",
        (a._memory_efficient,),
    ),
    "conformer": ("conformer", (a._conformer,)),
    "rotary-embedding-torch": ("rotary_embedding_torch", (a._rotary,)),
    "diffusers": (
        "diffusers",
        (a._diffusers_attention, a._diffusers_block, a._diffusers_2d, *vision.DIFFUSERS),
    ),
    "timm": ("timm", vision.TIMM),
    "torch-geometric": ("torch_geometric", (a._gat, a._transformer_conv)),
    "fair-esm": ("esm", (a._esm2,)),
    "openai-whisper": ("whisper", (a._whisper,)),
}

SEED = 0


def _version(distribution):
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _build(adapter, sizes):
    torch.manual_seed(SEED)
    return adapter.build(sizes).eval()


def _inputs(adapter, sizes, padding):
    return adapter.inputs(sizes, padding, torch.Generator().manual_seed(1234))


def run(name, discover=False) -> dict:
    module, factories = PACKAGES[name]
    start = time.perf_counter()
    result: dict = {
        "name": name,
        "source": "package",
        "package": name,
        "kind": "package",
        "configs": {},
    }
    try:
        importlib.import_module(module)
    except Exception as error:
        result.update(status="not installed", error=error_text(error))
        return result
    result["versions"] = {name: _version(name)}
    result["status"] = "ok"
    result["models"] = {}
    checks = {}
    for index, factory in enumerate(factories):
        adapter = factory()
        result["models"][str(index)] = adapter.label
        result.setdefault("modalities", {})[adapter.label] = adapter.modality
        for size_tag in ("d",) if discover else adapter.sizes:
            sizes = SIZES[size_tag]
            try:
                model = _build(adapter, sizes)
            except Exception as error:
                result["configs"][f"{index}{size_tag}"] = {"build_error": error_text(error)}
                continue
            for padding in ("n",) if discover else adapter.paddings:
                args, kwargs = _inputs(adapter, sizes, padding)
                tag = f"{index}{size_tag}{padding}"
                result["configs"][tag] = run_config(model, args, kwargs)
                result["configs"][tag]["model"] = adapter.label
            if size_tag == "d" and not discover:
                padding = "r" if "r" in adapter.paddings else "n"
                checks[adapter.label] = run_check(model, *_inputs(adapter, sizes, padding))
    if checks:
        result["check"] = _merge_checks(checks)
    if all("plain_error" in c or "build_error" in c for c in result["configs"].values()):
        result["status"] = "not built"
        result["error"] = next(iter(result["configs"].values()), {}).get(
            "plain_error", "no model ran"
        )
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


def _merge_checks(checks) -> dict:
    """One check record for the package: every model's probes, named by model."""
    out: dict = {"probes": [], "findings": [], "differences_after": []}
    for label, c in checks.items():
        if "crash" in c and "crash" not in out:
            out["crash"] = {**c["crash"], "error": f"{label}: {c['crash']['error']}"}
        for p in c.get("probes", []):
            out["probes"].append({**p, "name": f"{label}: {p['name']}"})
        out["findings"] += c.get("findings", [])
        out["differences_after"] += [f"{label}: {d}" for d in c.get("differences_after", [])]
    return out


def run_tags(name, index, tags) -> dict:
    """One adapter of a package at the named settings (`dn`, `cr`, ...): the CI sample's."""
    module, factories = PACKAGES[name]
    importlib.import_module(module)
    adapter = factories[index]()
    result: dict = {"name": f"{name}: {adapter.label}", "configs": {}}
    for size_tag, padding in tags:
        sizes = SIZES[size_tag]
        model = _build(adapter, sizes)
        padding = padding if padding in adapter.paddings else "n"
        result["configs"][f"{size_tag}{padding}"] = run_config(
            model, *_inputs(adapter, sizes, padding)
        )
    return result
