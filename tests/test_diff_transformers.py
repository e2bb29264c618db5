"""shapeguard.diff on tiny transformers decoders: a model against a copy of itself, eager
against sdpa, float32 against bfloat16, all at the tolerance of their dtypes."""

import pytest
import torch

import shapeguard

transformers = pytest.importorskip("transformers")

TEXT = dict(
    vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip
CONFIGS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16, "sliding_window": 4}),
}


def _model(name: str, impl: str = "eager", seed: int = 0):
    config_cls, model_cls, extra = CONFIGS[name]
    config = getattr(transformers, config_cls)(**TEXT, **extra, attn_implementation=impl)
    torch.manual_seed(seed)
    return getattr(transformers, model_cls)(config).eval()


def _ids(batch: int = 3, seq: int = 7):
    return torch.randint(3, 100, (batch, seq), generator=torch.Generator().manual_seed(1))


def test_llama_against_a_copy_of_itself_agrees():
    ref, port = _model("llama"), _model("llama", seed=1)
    result = shapeguard.diff(ref, port, _ids())
    assert result.agree, str(result)
    assert result.matched.counts()["name"] == len(list(ref.parameters()))
    assert not result.matched.ref_unmatched and not result.matched.port_unmatched
    assert "diff: LlamaForCausalLM (port) against LlamaForCausalLM (reference) agree" in str(result)
    # The port's own (different) weights are back.
    assert not torch.equal(ref.lm_head.weight, port.lm_head.weight)


# Gemma2 has no sdpa path in this transformers (it refuses it): eager against flex there.
@pytest.mark.parametrize(
    "name, backend",
    [("llama", "sdpa"), ("qwen2", "sdpa"), ("mistral", "sdpa"), ("gemma2", "flex_attention"),
     ("llama", "flex_attention")],
)  # fmt: skip
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_eager_against_another_backend_agrees(name, backend):
    model = _model(name)
    result = shapeguard.diff(model, None, _ids(seq=9), backends=("eager", backend))
    assert result.agree, str(result)
    assert result.compared >= 20  # context and each module's output at least
    assert model.config._attn_implementation == "eager"  # switched back


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_three_backends_each_agree_with_eager():
    model = _model("llama")
    result = shapeguard.diff(model, None, _ids(seq=9), backends=("eager", "sdpa", "flex_attention"))
    assert result.agree, str(result)
    lines = str(result).splitlines()
    assert lines[0] == "diff: 2 backends against LlamaForCausalLM[eager]: 2 agree, 0 diverge"
    assert lines[1].startswith("  LlamaForCausalLM[sdpa]: agrees (")
    assert lines[2].startswith("  LlamaForCausalLM[flex_attention]: agrees (")
    assert model.config._attn_implementation == "eager"


def test_a_backend_the_model_refuses_is_an_option_error():
    from shapeguard._diff.engine import DiffOptionError

    model = _model("gemma2")
    with pytest.raises(DiffOptionError, match="backends: 'sdpa': Gemma2ForCausalLM does not"):
        shapeguard.diff(model, None, _ids(), backends=("eager", "sdpa"))
    assert model.config._attn_implementation == "eager"


def test_float32_against_bfloat16_agrees_at_its_tolerance():
    model = _model("llama")
    result = shapeguard.diff(model, None, _ids(), dtypes=("float32", "bfloat16"))
    assert result.agree, str(result)
    assert result.tolerance == (5e-2, 1e-1)
    assert next(model.parameters()).dtype == torch.float32  # a copy ran in bfloat16


def test_a_changed_weight_diverges_at_its_projection():
    ref, port = _model("llama"), _model("llama")
    mapping = {"model.layers.1.self_attn.k_proj.weight": "model.layers.1.self_attn.q_proj.weight"}
    with pytest.raises(ValueError, match=r"\[32, 64\] != model.layers.1.self_attn.q_proj"):
        shapeguard.diff(ref, port, _ids(), weights=mapping)
    with torch.no_grad():
        port.model.layers[1].self_attn.k_proj.weight.mul_(1.5)
    result = shapeguard.diff(ref, port, _ids(), weights="none")
    assert result.first.key == "model.layers.1.self_attn.k_proj block"
    assert result.first.ref.source.startswith("def forward(self, input")
