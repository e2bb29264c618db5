"""The installed wheel's smoke test (.ci/wheel runs it from a folder with no checkout in it).

Exits non-zero with the reason when the package imported is not the installed one, when
`import shapeguard` pulls in torch, when a tiny attention is traced with other shapes than
its own, or when a transposed K is not caught. Sizes: batch 3, heads 4, seq 7, d_k 16.
"""

import sys
from importlib import metadata

import shapeguard

if "site-packages" not in (shapeguard.__file__ or ""):
    sys.exit(f"shapeguard was imported from {shapeguard.__file__}, not the installed wheel")
if "torch" in sys.modules:
    sys.exit("import shapeguard imported torch")
if shapeguard.__version__ != metadata.version("shapeguard-attn"):
    sys.exit(f"__version__ {shapeguard.__version__} is not the installed distribution's")

import torch  # noqa: E402  (after the check that shapeguard did not import it)
from torch import nn  # noqa: E402


class Attention(nn.Module):
    def __init__(self, d_model: int = 64, n_heads: int = 4, transpose_k: bool = True):
        super().__init__()
        self.n_heads, self.d_k, self.transpose_k = n_heads, d_model // n_heads, transpose_k
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x):
        B, S, D = x.shape
        Q, K, V = (
            t.view(B, S, self.n_heads, self.d_k).transpose(1, 2) for t in self.qkv(x).split(D, -1)
        )
        if self.transpose_k:
            K = K.transpose(-2, -1)
        scores = Q @ K / self.d_k**0.5
        return (scores.softmax(dim=-1) @ V).transpose(1, 2).reshape(B, S, D)


x = torch.randn(3, 7, 64)
trace = shapeguard.trace(Attention(), x)
if trace.findings or trace.shape_of("scores") != (3, 4, 7, 7):
    sys.exit(f"the correct attention traced wrong:\n{trace.table()}")
try:
    shapeguard.guard(Attention(d_model=48, n_heads=4, transpose_k=False))(torch.randn(3, 7, 48))
except shapeguard.ShapeError as error:
    if "Q.d_k (12) != K.seq (7)" not in str(error) or "hint: K was not transposed" not in str(
        error
    ):
        sys.exit(f"the transposed K was caught with another message:\n{error}")
else:
    sys.exit("the untransposed K was not caught")
print(f"smoke test passed: shapeguard {shapeguard.__version__} from {shapeguard.__file__}")
