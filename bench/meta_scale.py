"""Meta-device scale: `shapeguard trace --device meta` on a Llama-70B-shaped stack.

The model (bench/models/llama70b_attention.py) has 80 blocks of GQA attention
(d_model 8192, 64 query heads, 8 key/value heads) and a SwiGLU MLP, run at
batch 1, seq 8192. The command runs in a subprocess pinned to two cores; its
wall time, CPU time and peak RSS (`getrusage(RUSAGE_CHILDREN).ru_maxrss`) are
measured, next to the memory the same forward would need on cpu: the
parameters plus every activation an op allocates (view ops excluded), counted
from a trace of the same model made here, in this process, on meta. That is
what a training forward keeps for backward; an inference forward frees most
activations early but still needs the parameters.

    python bench/meta_scale.py            # prints the figures
    python bench/meta_scale.py --layers 8 # a smaller stack
"""

import argparse
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_FILE = os.path.join(HERE, "models", "llama70b_attention.py")

TIME_LIMIT_S = 10.0
RSS_LIMIT_BYTES = 1 << 30


def run_cli(model_file: str = MODEL_FILE, *, layers: int | None = None, cores: int = 2) -> dict:
    """Run `shapeguard trace --device meta` in a subprocess; its wall, CPU time and peak RSS."""
    command = [sys.executable, "-m", "shapeguard", "trace", model_file, "--device", "meta"]
    if layers is not None:
        command += ["--arg", f"n_layers={layers}"]
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []

    def pin() -> None:
        if available:
            os.sched_setaffinity(0, available[:cores])

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, preexec_fn=pin, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    summary = next((line for line in done.stdout.splitlines() if " ops in " in line), "")
    return {
        "command": " ".join(["shapeguard", *command[3:]]),
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        # Linux reports ru_maxrss in KiB: the largest child so far, which is this one.
        "peak_rss_bytes": after.ru_maxrss * 1024,
        "cores": min(cores, len(available)) if available else None,
        "summary": summary,
    }


def cpu_memory(model_file: str = MODEL_FILE, *, layers: int | None = None) -> dict:
    """Parameters and allocated activations of one forward, counted on meta (no memory)."""
    import torch

    import shapeguard
    from shapeguard import _ops
    from shapeguard._cli import inputs as _inputs
    from shapeguard._cli import loader as _loader
    from shapeguard._cli import picking as _picking

    with _loader.loaded(model_file) as module:
        kwargs = {"n_layers": layers} if layers is not None else {}
        model = _picking.pick_model(module, kwargs=kwargs, device="meta").model
        inputs = _inputs.make_inputs(module, model, device="meta")
        with torch.no_grad():
            trace = shapeguard.trace(model, *inputs.args, **inputs.kwargs)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    n_params = sum(p.numel() for p in model.parameters())
    inputs_bytes = sum(t.numel() * t.element_size() for t in inputs.args if hasattr(t, "numel"))
    # Views (the op table's `aliases` ops) share their input's storage: no new memory.
    views = _ops.spellings_where(aliases=True)
    activations = sum(
        record.nbytes for event in trace.events if event.op not in views for record in event.outputs
    )
    return {
        "parameters": n_params,
        "parameter_bytes": params,
        "input_bytes": inputs_bytes,
        "activation_bytes": activations,
        "total_bytes": params + inputs_bytes + activations,
        "ops": len(trace.events),
    }


def measure(*, layers: int | None = None, cores: int = 2) -> dict:
    """Both halves: the CLI run on meta and the memory the same model needs on cpu."""
    result = run_cli(layers=layers, cores=cores)
    result.update(cpu_memory(layers=layers))
    result["within_limits"] = (
        result["wall_s"] < TIME_LIMIT_S and result["peak_rss_bytes"] < RSS_LIMIT_BYTES
    )
    return result


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.1f} GiB"


def report(result: dict) -> str:
    lines = [
        f"command          {result['command']}",
        f"trace            {result['summary']}",
        f"wall time        {result['wall_s']:.2f} s  (limit {TIME_LIMIT_S:.0f} s; "
        f"{result['cores']} cores; CPU time {result['cpu_s']:.2f} s)",
        f"peak RSS         {result['peak_rss_bytes'] / (1 << 20):,.0f} MiB  (limit 1 GiB)",
        f"on cpu it needs  {_gib(result['total_bytes'])}: parameters {_gib(result['parameter_bytes'])} "
        f"({result['parameters'] / 1e9:.1f} B), activations {_gib(result['activation_bytes'])}, "
        f"input {_gib(result['input_bytes'])}",
        f"within limits    {'yes' if result['within_limits'] else 'NO'}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=None, help="blocks in the stack (default 80)")
    parser.add_argument("--cores", type=int, default=2)
    options = parser.parse_args()
    print(report(measure(layers=options.layers, cores=options.cores)))
