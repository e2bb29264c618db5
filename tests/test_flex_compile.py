"""Compiled FlexAttention in a trace (issue 28): code compiled by torch.compile runs with
the interceptor off torch's mode stack, so a traced call runs the compiled code an
untraced call runs and its output is bitwise the same, also past dynamo's recompile limit
(where a frame compiled once more under the mode would run eagerly instead).

Dynamo's recompile limit is lowered to 1 inside each test (`torch._dynamo.config.patch`,
restored after) and its caches reset before and after, so the first, untraced call spends
the limit as transformers' llama and qwen2 in one process do (bench/world_flex.py).
"""

import contextlib
import warnings

import pytest
import torch

import shapeguard
from shapeguard._trace import interceptor

flex = pytest.importorskip("torch.nn.attention.flex_attention")

# These tests compare traced with untraced calls, so no background trace may be open.
pytestmark = [
    pytest.mark.no_shapeguard,
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
    # torch's compile path warns of its own deprecations (torch.jit.script_method).
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


@contextlib.contextmanager
def one_compile_per_frame():
    """Dynamo's recompile limit at 1, its caches empty, both as they were after."""
    import torch._dynamo

    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(recompile_limit=1), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # dynamo: "hit recompile_limit"
            yield
    finally:
        torch._dynamo.reset()


def stack() -> list:
    return [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]


def tiny_flex_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    config._attn_implementation = "flex_attention"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_a_transformers_flex_model_past_the_recompile_limit_is_bitwise_unchanged():
    """transformers runs `torch.compile(flex_attention)`: before the fix the traced call
    recompiled it under shapeguard's mode, hit the limit and ran flex eagerly (logits off
    by about 4e-8 at these sizes)."""
    model = tiny_flex_llama()
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    before = stack()
    with one_compile_per_frame(), torch.no_grad():
        plain = model(ids).logits
        with shapeguard.trace() as trace:
            traced = model(ids).logits
            mode = interceptor._holder().mode
            assert interceptor.on_stack(mode)  # put back after the compiled calls
        again = model(ids).logits
    assert torch.equal(plain, again)  # the untraced run is one compiled kernel
    assert torch.equal(traced, plain), (traced - plain).abs().max().item()
    assert trace.findings == [], [str(f) for f in trace.findings]
    assert stack() == before


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


@pytest.mark.parametrize(
    "sizes",
    [(3, 4, 7, 16), (4, 4, 4, 4), (4, 8, 64, 64)],
    ids=["distinct", "coincident", "realistic"],
)
def test_torch_s_flex_attention_is_checked_then_runs_its_compiled_kernel_off_the_stack(sizes):
    """torch's `flex_attention` called eagerly compiles its kernel: the trace still checks
    the call and reads its reach (one event), and the output is bitwise the untraced one."""
    batch, heads, seq, d_k = sizes
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq, d_k, generator=gen) for _ in range(3))
    mask = flex.create_block_mask(causal, None, None, seq, seq, device="cpu")
    before = stack()
    with one_compile_per_frame():
        plain = flex.flex_attention(q, k, v, block_mask=mask)
        with shapeguard.trace() as trace:
            traced = flex.flex_attention(q, k, v, block_mask=mask)
    assert torch.equal(traced, plain)
    assert [event.op for event in trace.events] == ["flex_attention"]
    (reach,) = trace.reach
    assert reach.how == "block_mask"
    assert stack() == before


class Above(torch.overrides.TorchFunctionMode):
    """A user's mode pushed above the interceptor."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_off_stack_takes_the_interceptor_out_from_under_a_user_mode_and_puts_it_back():
    seen = []
    with shapeguard.trace(), Above() as above:
        mode = interceptor._holder().mode
        assert stack()[-2:] == [mode, above]
        interceptor.off_stack(lambda: seen.append(stack()), (), {})
        assert seen == [[m for m in stack() if m is not mode]]
        assert stack()[-2:] == [mode, above]
        with pytest.raises(ZeroDivisionError):
            interceptor.off_stack(lambda: 1 / 0, (), {})
        assert stack()[-2:] == [mode, above]


def test_off_stack_outside_a_trace_calls_the_function_as_it_is():
    before = stack()
    assert interceptor.off_stack(lambda a, b=0: a + b, (1,), {"b": 2}) == 3
    assert stack() == before


# -- other compiled code inside a traced forward ---------------------------------------------
class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        return torch.nn.functional.gelu(self.proj(x)).softmax(-1) * 3.1


class WithCompiledBlock(torch.nn.Module):
    """A user's model whose block is `torch.compile`d (an `OptimizedModule`)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = torch.compile(Block())

    def forward(self, x):
        return self.block(x * 2) + 1


def test_a_compiled_submodule_runs_its_compiled_code_and_the_ops_around_it_are_traced():
    """Before: dynamo traced the session's global module hooks inside the compiled forward
    and failed ("already tracked for mutation"); with the hooks quiet under dynamo, the
    traced call was compiled again under the mode and, past the limit, ran eagerly (output
    off by about 1e-7). Now the compiled module is suspended as torch's composites are."""
    torch.manual_seed(0)
    model = WithCompiledBlock()
    x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(0))
    before = stack()
    with one_compile_per_frame(), torch.no_grad():
        plain = model(x)
        with shapeguard.trace() as trace:
            traced = model(x)
            assert interceptor.on_stack(interceptor._holder().mode)
    assert torch.equal(traced, plain), (traced - plain).abs().max().item()
    ops = [event.op for event in trace.events]
    assert "mul" in ops and "add" in ops  # the user's own ops around the block
    assert "linear" not in ops and "softmax" not in ops  # nothing of the compiled code
    assert stack() == before


def test_create_block_mask_compiled_by_transformers_runs_off_the_stack():
    """`create_block_mask(..., _compile=True)` (transformers' masks) compiles itself: run off
    the stack, no second compile and the same mask; without `_compile` it is traced as it
    was (the original, under the interceptor)."""
    seen = []

    def causal_seen(b, h, q_idx, kv_idx):
        seen.append(stack())
        return q_idx >= kv_idx

    with one_compile_per_frame():
        plain = flex.create_block_mask(causal, None, None, 256, 256, device="cpu", _compile=True)
        with shapeguard.trace():
            traced = flex.create_block_mask(
                causal, None, None, 256, 256, device="cpu", _compile=True
            )
            mode = interceptor._holder().mode
            flex.create_block_mask(causal_seen, None, None, 128, 128, device="cpu")
    assert torch.equal(traced.to_dense(), plain.to_dense())
    assert seen and all(mode in modes for modes in seen)  # the eager call: under the mode
