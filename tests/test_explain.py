"""`shapeguard explain`: each message family, with the real text torch produces.

Every PyTorch message below is made by running the bad code in the test, never
typed by hand, so a change in torch's wording fails here first. flash-attn's
messages need its CUDA extension; those come from its source (the format strings
quoted in research/prior-art.md section 3.1 and `csrc/flash_attn/flash_api.cpp`),
and the ImportError messages are Python's own, made with a stand-in module.
"""

import importlib
import importlib.util
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from torch import nn

from shapeguard._cli.commands import cli
from shapeguard._explain.explain import explain, factor_pairs

pytestmark = pytest.mark.no_shapeguard  # these tests trigger violations on purpose

# Pairwise-distinct sizes: batch 2, heads 3, seq_q 5, seq_k 7, d_k 11.
B, H, SQ, SK, DK = 2, 3, 5, 7, 11


def torch_message(bad) -> str:
    """The first line of the error that `bad()` raises, as torch wrote it."""
    with pytest.raises((RuntimeError, AssertionError, IndexError, ImportError)) as info:
        bad()
    return f"{type(info.value).__name__}: {str(info.value).splitlines()[0]}"


def _from_flash_attn_import_flash_attention():
    # A stand-in `flash_attn` (the real one needs CUDA): Python writes the ImportError itself.
    stand_in = types.ModuleType("flash_attn")
    stand_in.flash_attn_func = lambda *a, **k: None
    saved = sys.modules.get("flash_attn")
    sys.modules["flash_attn"] = stand_in
    try:
        exec("from flash_attn import flash_attention", {})
    finally:
        if saved is None:
            del sys.modules["flash_attn"]
        else:
            sys.modules["flash_attn"] = saved


def _import_missing_flash_attn():
    if "flash_attn" in sys.modules or importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is importable here, so its absence cannot be shown")
    importlib.import_module("flash_attn")


def _sdpa(q_shape, k_shape, v_shape, **kwargs):
    return lambda: F.scaled_dot_product_attention(
        torch.randn(q_shape), torch.randn(k_shape), torch.randn(v_shape), **kwargs
    )


def _mha(**call):
    mha = nn.MultiheadAttention(33, H, batch_first=True)
    x = torch.randn(B, SQ, 33)
    return lambda: mha(x, x, x, **call)


def _causal_and_mask():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(B, H, SQ, DK)
    with sdpa_kernel(SDPBackend.MATH):
        F.scaled_dot_product_attention(
            q, q, q, attn_mask=torch.ones(SQ, SQ, dtype=torch.bool), is_causal=True
        )


# (the bad code, the kind, text that must be in the explanation)
TORCH_CASES = [
    pytest.param(
        lambda: nn.Linear(256, 64)(torch.randn(2, 32, 128)),
        "linear_in_features",
        [
            "a Linear layer got inputs with 128 features, but its weight takes in_features=256",
            "mat1   [rows=64, features=128]  the input with all leading axes flattened: "
            "64 rows = batch x seq (1x64, 2x32, 4x16, 8x8)",
            "mat2   [in_features=256, out_features=64]  the Linear's weight, transposed",
            "hint: the Linear that fits this input is nn.Linear(128, 64)",
            "256 = 2 x 128: the input may still be one head's d_k=128",
        ],
        id="linear",
    ),
    pytest.param(
        lambda: torch.randn(B, H, SQ, DK) @ torch.randn(B, H, DK + 1, SK),
        "bmm_inner",
        [
            f"left operand's last axis ({DK}) != the right operand's second-to-last axis ({DK + 1})",
            f"batch1  [{B * H}, rows, {DK}]",
            f"{B * H} = batch x heads (1x6, 2x3)",
            "K was not transposed (use K.transpose(-2, -1))",
        ],
        id="matmul-inner",
    ),
    pytest.param(
        lambda: torch.bmm(torch.randn(B * H, SQ, DK), torch.randn(B * 4, DK, SK)),
        "bmm_batch",
        ["the batch axes differ: 6 != 8", "enable_gqa=True"],
        id="bmm-batch",
    ),
    pytest.param(
        lambda: torch.bmm(torch.randn(B, H, SQ, DK), torch.randn(B, H, DK, SK)),
        "bmm_rank",
        ["torch.bmm takes 3-D tensors", "use torch.matmul"],
        id="bmm-rank",
    ),
    pytest.param(
        lambda: torch.randn(B, H, SQ, SK) + torch.randn(B, SK),
        "broadcast",
        [
            f"sizes {SQ} and {B} do not broadcast at dimension 2 of the result; if the result is "
            "4-D scores [batch, heads, seq_q, seq_k], that axis is seq_q",
            "mask[:, None, None, :]",
        ],
        id="broadcast-mask",
    ),
    pytest.param(
        lambda: torch.randn(B, SQ, 30).view(B, SQ, 4, -1),
        "view_size",
        [
            "view/reshape: the target shape [2, 5, 4, -1] cannot hold the input's 300 elements",
            "300 elements = 2 x 2 x 3 x 5 x 5",
            "d_model=30 features per token; 30 is not divisible by 4 heads",
            "head counts that divide 30: 2, 3, 5, 6, 10, 15, 30",
        ],
        id="view-heads-minus-one",
    ),
    pytest.param(
        lambda: torch.randn(B, SQ, 33).view(B, SQ, H, 12),
        "view_size",
        ["heads x d_k = 3 x 12 = 36, but the input has d_model=33", "d_k = d_model // heads = 11"],
        id="view-heads-dk",
    ),
    pytest.param(
        lambda: torch.randn(B, H, SQ, DK).reshape(B, -1, 34),
        "view_size",
        ["merging heads back: [batch=2, seq=-1, d_model=34]"],
        id="view-merge",
    ),
    pytest.param(
        lambda: torch.randn(B, H, SQ, DK).transpose(1, 2).view(B, SQ, H * DK),
        "noncontiguous_view",
        [
            "view cannot merge axes of a non-contiguous tensor",
            ".contiguous().view(batch, seq, d_model)",
        ],
        id="view-stride",
    ),
    pytest.param(
        lambda: torch.randn(B, SQ, DK).transpose(1, 3),
        "dim_out_of_range",
        ["an op asked for axis 3 of a tensor with 3 axes", "heads were never split"],
        id="dim-range",
    ),
    pytest.param(
        lambda: torch.randn(B, H, SQ, SK).masked_fill(torch.ones(B, 1, SQ, SK), 0.0),
        "mask_dtype",
        ["masked_fill needs a bool mask, but the mask is float", "mask == 0"],
        id="masked-fill-float",
    ),
    pytest.param(
        _sdpa(
            (B, H, SQ, DK),
            (B, H, SK, DK),
            (B, H, SK, DK),
            attn_mask=torch.ones(B, 1, SQ, SK, dtype=torch.long),
        ),
        "sdpa_mask_dtype",
        ["attn_mask is long int; it must be bool or the query's dtype (float)", "True = attend"],
        id="sdpa-mask-dtype",
    ),
    pytest.param(
        _sdpa((B, 8, SQ, DK), (B, H, SK, DK), (B, H, SK, DK), enable_gqa=True),
        "sdpa_gqa_heads",
        ["key/value head count must divide the query head count", "cut off mid-sentence"],
        id="sdpa-gqa",
    ),
    pytest.param(
        _sdpa(
            (B, H, SQ, DK),
            (B, H, SK, DK),
            (B, H, SK, DK),
            attn_mask=torch.ones(B, SK, dtype=torch.bool),
        ),
        "broadcast",
        ["do not broadcast at dimension 2"],
        id="sdpa-mask-shape",
    ),
    pytest.param(
        _causal_and_mask,
        "sdpa_mask_and_causal",
        ["attn_mask and is_causal=True were both given"],
        id="sdpa-mask-and-causal",
    ),
    pytest.param(
        lambda: nn.MultiheadAttention(30, 4),
        "head_divisibility",
        ["embed_dim % num_heads != 0"],
        id="mha-divisible",
    ),
    pytest.param(
        _mha(key_padding_mask=torch.zeros(B, SQ + 1, dtype=torch.bool)),
        "mha_key_padding_mask",
        [f"key_padding_mask has {SQ + 1} positions, but the keys have seq_k={SQ}", "True = ignore"],
        id="mha-key-padding",
    ),
    pytest.param(
        # A batch-first input to a module built without batch_first=True: it reads batch=SQ.
        lambda: nn.MultiheadAttention(33, H)(
            *(torch.randn(B, SQ, 33),) * 3, key_padding_mask=torch.zeros(B, SQ, dtype=torch.bool)
        ),
        "mha_key_padding_mask",
        [
            f"key_padding_mask has {B} rows, but the module reads a batch of {SQ} from the key",
            "reads the key as [seq_k, batch, E]",
            "batch_first=True",
            f"key_padding_mask  [{B}, ...]  must be [batch={SQ}, seq_k]",
        ],
        id="mha-key-padding-batch-first",
    ),
    pytest.param(
        lambda: torch.einsum(
            "bhqd,bhkd->bhqk", torch.randn(B, H, SQ, DK), torch.randn(B, H, SK, 2 * DK)
        ),
        "einsum_dim",
        [
            f"einsum: subscript d has size {DK} in an earlier operand but {2 * DK} in operand 1",
            f"operand 1  d={2 * DK}",
            f"{2 * DK} = 2 x {DK}: one operand may hold 2 heads merged",
            "in another order than it has them",
        ],
        id="einsum-size",
    ),
    pytest.param(
        _mha(attn_mask=torch.zeros(B, SQ, SQ, dtype=torch.bool)),
        "mha_attn_mask_3d",
        [
            f"must be [batch*num_heads={B * H}, seq_q={SQ}, seq_k={SQ}]",
            "repeat_interleave(3, dim=0)",
        ],
        id="mha-mask-3d",
    ),
    pytest.param(
        _mha(attn_mask=torch.zeros(SQ, SK, dtype=torch.bool)),
        "mha_attn_mask_2d",
        [f"a 2-D attn_mask must be [seq_q={SQ}, seq_k={SQ}]", f"attn_mask  [{SQ}, {SK}]"],
        id="mha-mask-2d",
    ),
    pytest.param(
        lambda: nn.MultiheadAttention(33, H, batch_first=True)(*(torch.randn(B, SQ, 34),) * 3),
        "mha_embed_dim",
        ["the query's last axis is 34, but embed_dim is 33"],
        id="mha-embed",
    ),
    pytest.param(
        lambda: nn.MultiheadAttention(33, H)(
            torch.randn(SQ, B, 33), torch.randn(SK, B, 33), torch.randn(6, B, 33)
        ),
        "mha_key_value",
        ["key and value must have the same shape", "key    [7, 2, 33]", "value  [6, 2, 33]"],
        id="mha-key-value",
    ),
    pytest.param(
        lambda: nn.MultiheadAttention(33, H)(*(torch.randn(B, H, SQ, 33),) * 3),
        "mha_rank",
        ["takes 2-D or 3-D inputs; the query has 4 axes"],
        id="mha-rank",
    ),
    pytest.param(
        _from_flash_attn_import_flash_attention,
        "flash_import",
        [
            "flash_attn has no function named flash_attention",
            "`from flash_attn import flash_attn_func`",
            "[batch, seq, heads, head_dim] fp16/bf16 CUDA tensors",
        ],
        id="flash-import",
    ),
    pytest.param(
        _import_missing_flash_attn,
        "flash_missing",
        ["flash-attn is not installed", "F.scaled_dot_product_attention"],
        id="flash-missing",
    ),
]


@pytest.mark.parametrize(("bad", "kind", "expected"), TORCH_CASES)
def test_explains_real_torch_messages(bad, kind, expected):
    message = torch_message(bad)
    found = explain(message)
    assert [e.kind for e in found] == [kind], message
    text = found[0].render()
    assert text.splitlines()[1].strip() == f"torch said: {found[0].matched}"
    for piece in expected:
        assert piece in text, f"{piece!r} not in:\n{text}"


# flash-attn raises these from its CUDA extension, which cannot run here: the texts are
# its format strings as they read in csrc/flash_attn/flash_api.cpp (CHECK_SHAPE expands to
# `#x " must have shape (" #__VA_ARGS__ ")"`), quoted in research/prior-art.md section 3.1.
FLASH_CASES = [
    (
        "RuntimeError: k must have shape (batch_size, seqlen_k, num_heads_k, head_size_og)",
        "flash_shape",
        [
            "flash-attn: k must be (batch_size, seqlen_k, num_heads_k, head_size_og); its message prints no sizes",
            "q.transpose(1, 2)",
        ],
    ),
    (
        "RuntimeError: cu_seqlens_q must have shape (batch_size + 1)",
        "flash_shape",
        ["cu_seqlens_q must be (batch_size + 1)", "int32 cumulative query lengths"],
    ),
    (
        "RuntimeError: FlashAttention only support fp16 and bf16 data type",
        "flash_dtype",
        ["must be float16 or bfloat16", "torch.autocast"],
    ),
    (
        "RuntimeError: query and key must have the same dtype",
        "flash_dtype_mismatch",
        ["different dtypes"],
    ),
    ("RuntimeError: q must be on CUDA", "flash_device", ["q is not on a CUDA device"]),
    (
        "RuntimeError: Input tensor must have contiguous last dimension",
        "flash_contiguous",
        [".contiguous()"],
    ),
    (
        "RuntimeError: FlashAttention forward only supports head dimension at most 256",
        "flash_head_dim",
        ["head_dim is larger than 256"],
    ),
    (
        "RuntimeError: Number of heads in key/value must divide number of heads in query",
        "flash_gqa_heads",
        ["nheads (q) % nheads_k (k, v) != 0", "transpose(1, 2)"],
    ),
    ("RuntimeError: FlashAttention only supports Ampere GPUs or newer.", "flash_gpu", ["sm80"]),
]


@pytest.mark.parametrize(
    ("message", "kind", "expected"),
    FLASH_CASES,
    ids=[c[1] + str(i) for i, c in enumerate(FLASH_CASES)],
)
def test_explains_flash_attn_messages(message, kind, expected):
    found = explain(message)
    assert [e.kind for e in found] == [kind]
    text = found[0].render()
    for piece in expected:
        assert piece in text, f"{piece!r} not in:\n{text}"


def test_finds_every_message_in_a_traceback_in_order():
    first = torch_message(lambda: torch.randn(B, H, SQ, DK).transpose(1, 2).view(B, SQ, H * DK))
    second = torch_message(lambda: nn.Linear(12, 5)(torch.randn(B, SQ, DK)))
    text = f"Traceback (most recent call last):\n  File 'x.py', line 3\n{first}\n\nDuring handling...\n{second}\n"
    assert [e.kind for e in explain(text)] == ["noncontiguous_view", "linear_in_features"]


def test_unknown_text_is_not_explained():
    assert explain("KeyError: 'W_q.weight'") == []


def test_factor_pairs_lists_plausible_batch_by_seq():
    assert factor_pairs(64) == "1x64, 2x32, 4x16, 8x8"
    assert factor_pairs(720) == "1x720, 2x360, 3x240, 24x30"
    assert factor_pairs(13) == "1x13"


# -- through the command line ------------------------------------------------------------------


def test_cli_explains_an_argument():
    message = torch_message(lambda: nn.Linear(256, 64)(torch.randn(2, 32, 128)))
    result = CliRunner().invoke(cli, ["explain", message])
    assert result.exit_code == 0
    assert result.stdout.startswith("a Linear layer got inputs with 128 features")
    assert "nn.Linear(128, 64)" in result.stdout
    assert result.stderr == ""


def test_cli_reads_stdin():
    message = torch_message(lambda: torch.randn(B, H, SQ, SK) + torch.randn(B, SK))
    result = CliRunner().invoke(cli, ["explain"], input=f"Traceback ...\n{message}\n")
    assert result.exit_code == 0
    assert "do not broadcast at dimension 2" in result.stdout


def test_cli_unknown_message_exits_1():
    result = CliRunner().invoke(cli, ["explain", "ValueError: something else entirely"])
    assert result.exit_code == 1
    assert result.stdout == (
        "shapeguard has no explanation for this message: ValueError: something else entirely\n"
    )
    assert result.stderr == "shapeguard: no known error message found in the text\n"


def test_cli_empty_text_is_a_usage_error():
    result = CliRunner().invoke(cli, ["explain"], input="   \n")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert (
        result.stderr
        == "shapeguard: error: the error text is empty; paste the message torch printed\n"
    )
