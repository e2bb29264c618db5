"""A fixed sample of the world corpus (bench/world.py, docs/world.md) in the suite.

Correct models nobody here wrote, one per family: under a warn-mode trace no finding and no
exception, outputs bit-identical to the plain forward (caches included), no raise in raise
mode, the same under guard; decoders also generate the same tokens traced. Each runs at the
three size settings (distinct, coincident, all equal) with padding where the model takes a
mask. An architecture that fails today for a cause of the field report
(shared/research/field-reports/broad-transformers.md) is marked xfail(strict) with that
cause: the mark turns red as soon as the fix lands, and is then removed. None is marked today
(2026-12-07): XLNet (F2) and WavLM (F5), which failed in the field report, pass, as do the
others; `_xfail("F8")` is how a newly failing one is marked.
"""

import os
import sys

import pytest

pytest.importorskip("transformers")

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

# The sample traces itself, in warn and raise mode and under guard.
pytestmark = pytest.mark.no_shapeguard

# Distinct sizes with left padding, coincident with right padding, all equal without a mask.
TAGS = ("-dl", "-cr", "-an")
VISION_TAGS = ("-dn", "-cn")


def _xfail(cause):
    return pytest.mark.xfail(strict=True, reason=cause)


ARCHITECTURES = [
    pytest.param("mistral", id="mistral (llama-like, GQA)"),
    pytest.param("gpt2", id="gpt2"),
    pytest.param("bert", id="bert"),
    pytest.param("t5", id="t5"),
    pytest.param("whisper", id="whisper"),
    pytest.param("vit", id="vit"),
    pytest.param("bamba", id="bamba (Mamba-2 hybrid)"),
    pytest.param("falcon", id="falcon (sdpa, MQA)"),
    pytest.param("longformer", id="longformer"),
    pytest.param("xlnet", id="xlnet"),
    pytest.param("wavlm", id="wavlm"),
    pytest.param("ctrl", id="ctrl (x * np.sqrt(d): a NumPy scalar operand)"),
    pytest.param("pegasus_x", id="pegasus_x (NumPy scalars, block-local attention)"),
    pytest.param("qwen3_next", id="qwen3_next (linear attention, flatten to rows)"),
]


def _problems(result):
    """Every broken promise of one result, each with its evidence."""
    out = []
    for tag, c in result["configs"].items():
        if "plain_error" in c:
            out.append(f"{tag}: the plain forward fails: {c['plain_error']}")
            continue
        if "crash" in c:
            out.append(
                f"{tag}: crash in {c['crash']['mode']} mode: {c['crash']['error']} at {c['crash']['where']}"
            )
        for f in c.get("findings", []):
            out.append(f"{tag}: finding {f['kind']} x{f['count']}: {f['message']}")
        for key in ("differences", "guard_differences"):
            if c.get(key):
                out.append(f"{tag}: outputs not bit-identical ({key}): {c[key][:3]}")
        if not c.get("deterministic", True):
            out.append(f"{tag}: the plain forward is not deterministic, nothing compared")
        for key in ("raise", "guard_raise"):
            if c.get(key):
                out.append(f"{tag}: raise mode raised ({key}): {c[key]}")
    g = result.get("generate")
    if g:
        if "plain_error" in g:
            out.append(f"generate: the plain generate fails: {g['plain_error']}")
        if "crash" in g:
            out.append(f"generate: crash: {g['crash']['error']} at {g['crash']['where']}")
        for f in g.get("findings", []):
            out.append(f"generate: finding {f['kind']} x{f['count']}: {f['message']}")
        if g.get("guard_raise"):
            out.append(f"generate: the guard raised: {g['guard_raise']}")
        if g.get("trace_same") is False or g.get("guard_same") is False:
            out.append(
                f"generate: tokens differ (traced same: {g.get('trace_same')}, guarded same: {g.get('guard_same')})"
            )
    return out


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_transformers_architecture_is_clean(model_type):
    import _world_arch
    from _world_candidates import candidates

    candidate = {c.model_type: c for c in candidates()[0]}[model_type]
    tags = VISION_TAGS if candidate.kind in _world_arch.NO_ALL_EQUAL else TAGS
    result = _world_arch.run_tags(candidate, tags, generate=candidate.kind == "decoder")
    assert len(result["configs"]) == len(tags)
    problems = _problems(result)
    assert not problems, f"{model_type}:\n" + "\n".join(problems)


PACKAGES = [
    pytest.param("torch", 0, id="nn.MultiheadAttention(batch_first=True)"),
    pytest.param("torch", 1, id="nn.MultiheadAttention(batch_first=False)"),
    pytest.param("einops", 0, id="einops attention"),
    pytest.param("x-transformers", 0, id="x-transformers decoder (optional)"),
    pytest.param("diffusers", 0, id="diffusers cross-attention, an image block (optional)"),
]


@pytest.mark.parametrize(("package", "index"), PACKAGES)
def test_package_model_is_clean(package, index):
    import _world_packages

    module = _world_packages.PACKAGES[package][0]
    pytest.importorskip(module)  # x-transformers: only where the world group is installed
    result = _world_packages.run_tags(package, index, [("d", "l"), ("c", "r"), ("a", "n")])
    problems = _problems(result)
    assert not problems, f"{result['name']}:\n" + "\n".join(problems)


def test_the_summary_counts_what_must_be_zero():
    """The report's last line and exit status: a finding or a crash makes the run fail."""
    import _world_report

    clean = {"name": "m", "source": "transformers", "status": "ok",
             "configs": {"-dn": {"findings": [], "deterministic": True, "differences": []}}}  # fmt: skip
    tallied = _world_report.tally([clean])
    assert _world_report.lines(tallied)[-1] == (
        "world: architectures 1, packages 0, configs 1, crashes 0, findings 0, non-identical 0, "
        "raise-mode raises 0, generate mismatches 0, check failures 0, inconclusive 0"
    )
    assert not _world_report.failed(tallied["counts"])
    finding = {
        "kind": "view_mixes_axes",
        "severity": "warning",
        "count": 2,
        "message": "x.view(...): ...",
    }
    dirty = {**clean, "configs": {"-dn": {"findings": [finding], "deterministic": True},
                                  "-cn": {"crash": {"mode": "warn", "error": "TypeError: t", "where": "f.py:1"},
                                          "deterministic": True}},
             "check": {"probes": [{"name": "causality", "outcome": "inconclusive", "message": "why"},
                                  {"name": "batch independence", "outcome": "failed", "message": "moved"}]}}  # fmt: skip
    tallied = _world_report.tally([dirty])
    counts = tallied["counts"]
    assert (
        counts["findings"],
        counts["crashes"],
        counts["check failures"],
        counts["inconclusive"],
    ) == (1, 1, 1, 1)
    assert _world_report.failed(counts)
    text = "\n".join(_world_report.lines(tallied))
    assert "FINDING m: view_mixes_axes x2 in 1 configs: x.view(...): ..." in text
    assert (
        "INCONCLUSIVE m: causality: why" in text
        and "CHECK FAILED m: batch independence: moved" in text
    )


def test_the_report_counts_the_probes_that_held_per_non_text_block():
    """Issue 32: per image, audio or graph block, the probes that held (not n/a, not
    inconclusive), apart from the shape checks; text blocks of the same package are left out."""
    import _world_report

    probes = [("img: shape checks", "passed"), ("img: batch independence", "passed"),
              ("img: causality", "n/a"), ("img: reach", "inconclusive"),
              ("graph: shape checks", "passed"), ("graph: batch independence", "n/a"),
              ("txt: batch independence", "passed")]  # fmt: skip
    found = [{"kind": "batch_mixing", "count": 1, "message": "m"}]
    result = {"name": "pkg", "source": "package", "status": "ok",
              "modalities": {"img": "image", "graph": "graph", "txt": "text"},
              "configs": {"0dn": {"model": "img", "findings": []},
                          "0cn": {"model": "img", "findings": found},
                          "1dn": {"model": "graph", "findings": []},
                          "2dn": {"model": "txt", "findings": []}},
              "check": {"probes": [{"name": n, "outcome": o, "message": ""} for n, o in probes]}}  # fmt: skip
    rows = _world_report.non_text_blocks([result])
    assert [(r["block"], r["held"], r["findings"], r["configs"]) for r in rows] == [
        ("img", ["shape checks", "batch independence"], 1, 2),
        ("graph", ["shape checks"], 0, 1),
    ]
    text = _world_report.lines(_world_report.tally([result]), [result])
    assert text[-3:-1] == [
        "NON-TEXT pkg: img (image): held 2 (1 besides shape checks: batch independence), "
        "findings 1 of 2 configs, failed 0, inconclusive 1, n/a 1",
        "NON-TEXT pkg: graph (graph): held 1 (0 besides shape checks: none), "
        "findings 0 of 1 configs, failed 0, inconclusive 0, n/a 1",
    ]
