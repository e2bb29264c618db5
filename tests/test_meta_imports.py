"""`shapeguard trace --device meta` imports no compiler: not torch._dynamo, not
torch._inductor (+2.5 s), unless the model's own meta kernels do (torch's references for
div, tril or rms_norm import torch._dynamo on the meta device, with or without shapeguard).
"""

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.no_shapeguard

# Only ops whose meta kernels are torch's C++ ones: a plain meta forward of this model
# imports no compiler, so one that shapeguard's trace of it imports is shapeguard's.
MODEL = """
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, d_model=32, n_heads=4):
        super().__init__()
        self.d_model, self.n_heads = d_model, n_heads
        self.w_q = nn.Parameter(torch.randn(d_model, d_model))
        self.w_k = nn.Parameter(torch.randn(d_model, d_model))
        self.w_v = nn.Parameter(torch.randn(d_model, d_model))

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_heads
        q = (x @ self.w_q).view(B, T, H, C // H).transpose(1, 2)
        k = (x @ self.w_k).view(B, T, H, C // H).transpose(1, 2)
        v = (x @ self.w_v).view(B, T, H, C // H).transpose(1, 2)
        attn = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        return (attn @ v).transpose(1, 2).reshape(B, T, C)


def example_inputs():
    return (torch.randn(2, 5, 32),), {}
"""

REPORT = """
import json, sys
print(json.dumps([name in sys.modules for name in ("torch._dynamo", "torch._inductor")]))
"""

PLAIN = """
import sys, torch
sys.path.insert(0, {folder!r})
import meta_model
model = meta_model.Attention().to("meta")
with torch.no_grad():
    model(torch.empty(2, 5, 32, device="meta"))
"""

CLI = """
from shapeguard._cli.commands import main
try:
    main(["trace", {path!r}, "--device", "meta"])
except SystemExit as exit:
    assert exit.code == 0, exit.code
"""


def _compilers_imported(code: str) -> list[bool]:
    done = subprocess.run(
        [sys.executable, "-c", code + REPORT], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_meta_trace_imports_no_compiler(tmp_path):
    path = tmp_path / "meta_model.py"
    path.write_text(textwrap.dedent(MODEL))
    # The check can tell: torch alone on meta imports neither, for this model.
    assert _compilers_imported(PLAIN.format(folder=str(tmp_path))) == [False, False]
    assert _compilers_imported(CLI.format(path=str(path))) == [False, False]


def test_the_check_can_fail():
    # The same probe sees an import when there is one (a guard against a probe that
    # always says no).
    assert _compilers_imported("import torch._dynamo\n") == [True, True]
