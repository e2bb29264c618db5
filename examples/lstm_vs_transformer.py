"""The tutorial's LSTM-vs-Transformer table, measured instead of quoted.

The tutorial claims, at seq_len 512: 0.85 s/step for an LSTM against 0.21 s/step
for a Transformer, and 3.7 GB against 2.1 GB of memory. It gives neither the
model sizes nor the batch nor the hardware. This script trains both, with the
same width, depth, batch and data, for a few steps of next-token prediction at
seq_len 512, scaled down to run on a laptop CPU in well under a minute, and
prints what it measured beside the claim, whatever the numbers are:

    python examples/lstm_vs_transformer.py            # cpu, or cuda when present
    python examples/lstm_vs_transformer.py --device cpu --steps 5

Time is the median wall time of one training step (forward, loss, backward,
optimizer step) after one warm-up step. Memory is, on cuda, the peak allocated
by torch during the steps; on cpu, the growth of the process's peak resident
memory during the steps, measured in a fresh process per model so that one
model's memory does not hide the other's.

`build_model()` and `example_inputs()` give the Transformer at a small size,
so `shapeguard trace examples/lstm_vs_transformer.py` checks it like any model.
"""
# shapeguard: expect exit 0

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from torch import nn

CLAIMED = {"lstm": (0.85, 3.7), "transformer": (0.21, 2.1)}  # s/step, GB (the tutorial)
SEQ_LEN = 512
BATCH = 4
D_MODEL = 64
LAYERS = 2
HEADS = 4
VOCAB = 256


class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab=VOCAB, d_model=D_MODEL, layers=LAYERS):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.lstm = nn.LSTM(d_model, d_model, num_layers=layers, batch_first=True)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):  # tokens: [B, T]
        h, _ = self.lstm(self.embed(tokens))  # [B, T, d_model], one step after another
        return self.head(h)  # [B, T, vocab]


class TransformerLanguageModel(nn.Module):
    def __init__(self, vocab=VOCAB, d_model=D_MODEL, layers=LAYERS, heads=HEADS, max_len=SEQ_LEN):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, heads, dim_feedforward=2 * d_model, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):  # tokens: [B, T]
        T = tokens.size(1)
        x = self.embed(tokens) + self.position(torch.arange(T, device=tokens.device))
        causal = nn.Transformer.generate_square_subsequent_mask(T, device=tokens.device)
        h = self.encoder(x, mask=causal, is_causal=True)  # [B, T, d_model], all steps at once
        return self.head(h)  # [B, T, vocab]


MODELS = {"lstm": LSTMLanguageModel, "transformer": TransformerLanguageModel}


def build_model():
    return TransformerLanguageModel(vocab=97, d_model=48, layers=2, heads=4, max_len=64)


def example_inputs(batch=2, seq=13):
    return (torch.randint(0, 97, (batch, seq)),), {}


def measure(name: str, device: str, steps: int) -> dict:
    """Seconds per training step and peak memory of one model, in this process."""
    import resource

    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    torch.manual_seed(0)
    model = MODELS[name]().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ_LEN + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step():
        optimizer.zero_grad(set_to_none=True)
        logits = model(inputs)  # [B, T, vocab]
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up: allocator, kernels, optimizer state
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        # Weights, gradients, optimizer state and activations, as the process grew.
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_start) * 1024
    return {
        "seconds_per_step": statistics.median(times),
        "peak_bytes": peak,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def _worker(name: str, device: str, steps: int) -> None:
    print(json.dumps(measure(name, device, steps)))


def run(name: str, device: str, steps: int) -> dict:
    """Measure one model in a fresh Python process (cpu) or here (cuda)."""
    if device == "cuda":
        return measure(name, device, steps)
    command = [
        sys.executable,
        __file__,
        "--worker",
        name,
        "--device",
        device,
        "--steps",
        str(steps),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--worker", choices=sorted(MODELS), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        _worker(options.worker, options.device, options.steps)
        return
    results = {name: run(name, options.device, options.steps) for name in MODELS}
    lstm, transformer = results["lstm"], results["transformer"]
    scores_bytes = BATCH * HEADS * SEQ_LEN * SEQ_LEN * 4
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"seq_len {SEQ_LEN}, batch {BATCH}, d_model {D_MODEL}, {LAYERS} layers, {HEADS} heads, "
        f"vocab {VOCAB}, {options.device}, {torch.get_num_threads()} threads, "
        f"median of {options.steps} steps, load average {load:.1f} on {os.cpu_count()} cpus"
    )
    print(f"{'':<22}{'LSTM':>12}{'Transformer':>14}{'ratio':>9}   tutorial (LSTM / Transformer)")
    t_ratio = lstm["seconds_per_step"] / transformer["seconds_per_step"]
    m_ratio = lstm["peak_bytes"] / max(1, transformer["peak_bytes"])
    print(
        f"{'seconds per step':<22}{lstm['seconds_per_step']:>12.3f}"
        f"{transformer['seconds_per_step']:>14.3f}{t_ratio:>8.2f}x   "
        f"{CLAIMED['lstm'][0]} / {CLAIMED['transformer'][0]} s = "
        f"{CLAIMED['lstm'][0] / CLAIMED['transformer'][0]:.2f}x"
    )
    memory = "peak memory (MiB)" if options.device == "cuda" else "peak RSS growth (MiB)"
    print(
        f"{memory:<22}{lstm['peak_bytes'] / 2**20:>12.1f}{transformer['peak_bytes'] / 2**20:>14.1f}"
        f"{m_ratio:>8.2f}x   {CLAIMED['lstm'][1]} / {CLAIMED['transformer'][1]} GB = "
        f"{CLAIMED['lstm'][1] / CLAIMED['transformer'][1]:.2f}x"
    )
    print(f"{'parameters':<22}{lstm['parameters']:>12,}{transformer['parameters']:>14,}")
    print(
        f"Each attention layer's [batch, heads, seq, seq] scores hold "
        f"{scores_bytes / 2**20:.0f} MiB in float32 (x{LAYERS} layers, kept for backward); "
        f"they grow with seq_len squared: {4 * scores_bytes / 2**20:.0f} MiB at "
        f"{2 * SEQ_LEN}, {16 * scores_bytes / 2**30:.1f} GiB at {4 * SEQ_LEN}."
    )
    faster = "faster" if t_ratio > 1 else "slower"
    print(
        f"Measured here: the Transformer step is {max(t_ratio, 1 / t_ratio):.2f}x {faster} than "
        f"the LSTM's (the tutorial says {CLAIMED['lstm'][0] / CLAIMED['transformer'][0]:.1f}x "
        f"faster). The tutorial's absolute figures depend on a size and a device it does not "
        f"give; only the ratios compare."
    )


if __name__ == "__main__":
    main()
