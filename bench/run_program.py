"""Cost of `shapeguard run` on a tiny training loop, side by side with plain python.

`shapeguard run` traces the first call of each input signature of a watched module; every
other call runs with no session open, at the cost of its two global module hooks (and,
with `--steps`, an autograd hook per watched forward). Two figures:

- **per step**, in one process on one thread (`_timing.compare`): one training step (forward,
  backward, `optimizer.step`) of a 2-layer attention model at the realistic size (batch 4,
  heads 8, seq 64, d_k 64: d_model 512) with no hooks, and with `shapeguard run`'s hooks
  installed after its first, traced, step: the steady-state ratio a long training run pays;
- **whole program**, wall time of `python train.py` and `shapeguard run train.py` (the same
  loop, 30 steps; fresh interpreters, median of 3 each, interleaved): what a user waits,
  import and the one traced step included. Skipped in quick mode.

    python bench/run_program.py            # both figures
    python bench/run_program.py --quick    # the per-step figure at a small size
"""

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from _timing import Variant, compare, fmt_seconds, one_thread  # noqa: E402

LOOP = """
import math
import sys

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, S, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q = q.view(B, S, self.n_heads, self.d_k).transpose(1, 2)
        k = k.view(B, S, self.n_heads, self.d_k).transpose(1, 2)
        v = v.view(B, S, self.n_heads, self.d_k).transpose(1, 2)
        attn = (q @ k.transpose(-2, -1) / math.sqrt(self.d_k)).softmax(dim=-1)
        return self.out((attn @ v).transpose(1, 2).reshape(B, S, C))


class Model(nn.Module):
    def __init__(self, d_model, n_heads, layers=2):
        super().__init__()
        self.layers = nn.ModuleList(Attention(d_model, n_heads) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


def setup(batch, seq, d_model, n_heads):
    torch.manual_seed(0)
    model = Model(d_model, n_heads)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, seq, d_model)

    def step():
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    return step


if __name__ == "__main__":
    torch.set_num_threads(1)
    step = setup(4, 64, 512, 8)
    for _ in range(int(sys.argv[1])):
        step()
"""


def measure(quick: bool = False, *, repeats: int = 20) -> dict:
    """Median seconds of one plain step and one step under `shapeguard run`'s hooks, their
    paired ratio, the traced first step's seconds, and (unless `quick`) the whole-program
    wall times."""
    from shapeguard._cli.run_watch import Watcher

    one_thread()
    namespace: dict = {}
    exec(compile(LOOP, "<bench loop>", "exec"), namespace)
    size = (2, 16, 64, 4) if quick else (4, 64, 512, 8)
    step = namespace["setup"](*size)
    watcher = Watcher()

    @contextlib.contextmanager
    def hooked():
        watcher.install()
        try:
            yield
        finally:
            watcher.remove()

    start = time.perf_counter()
    with hooked():
        step()  # the traced first step
    traced_s = time.perf_counter() - start
    if not watcher.watched:
        raise RuntimeError("the bench's model was not traced: no attention found")
    timings = compare(
        [Variant("plain", step), Variant("shapeguard run", step, hooked)],
        repeats=5 if quick else repeats,
        warmup=1,
    )
    run = timings["shapeguard run"]
    result = {
        "size": "B={}, S={}, D={}, H={}".format(*size),
        "plain_s": timings["plain"].seconds,
        "run_s": run.seconds,
        "ratio": run.ratio,
        "ratio_q1": run.ratio_q1,
        "ratio_q3": run.ratio_q3,
        "traced_step_s": traced_s,
    }
    if not quick:
        result.update(_whole_program(steps=30, rounds=3))
    return result


def _whole_program(steps: int, rounds: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "train.py")
        Path(script).write_text(LOOP)
        commands = {
            "python": [sys.executable, script, str(steps)],
            "shapeguard run": [sys.executable, "-m", "shapeguard", "run", script, str(steps)],
        }
        walls: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(rounds):
            for name, command in commands.items():
                start = time.perf_counter()
                subprocess.run(command, env=env, capture_output=True, check=True)
                walls[name].append(time.perf_counter() - start)
    plain, run = statistics.median(walls["python"]), statistics.median(walls["shapeguard run"])
    return {"program_python_s": plain, "program_run_s": run, "program_ratio": run / plain}


def main() -> None:
    quick = "--quick" in sys.argv
    r = measure(quick)
    print(f"tiny training loop, {r['size']}, one thread")
    print(
        f"  one step: plain {fmt_seconds(r['plain_s'])}, under shapeguard run "
        f"{fmt_seconds(r['run_s'])}: {r['ratio']:.3f}x ({r['ratio_q1']:.3f}-{r['ratio_q3']:.3f})"
    )
    print(f"  the traced first step: {fmt_seconds(r['traced_step_s'])}")
    if "program_ratio" in r:
        print(
            f"  whole program (30 steps, wall): python {r['program_python_s']:.2f} s, "
            f"shapeguard run {r['program_run_s']:.2f} s: {r['program_ratio']:.2f}x"
        )


if __name__ == "__main__":
    main()
