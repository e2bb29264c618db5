"""What shapeguard costs per op, against the floors of the same run, and the targets of
issue 16 (each row with its target and met / missed).

The floors, side by side with shapeguard in `_timing.compare` (one thread, thread CPU
time, interleaved rounds): the plain call; a bare TorchFunctionMode that only calls the
op; a minimal recorder (the caller's file:line through the frames, input and output
shapes); that recorder plus a weak tensor -> record table (what any per-tensor naming
costs); `torchinfo.summary` (hooks on every module); then `shapeguard.trace` and `guard`.
Workloads: the tutorial MHA (examples/seed_mha.py) at tiny and medium sizes, a nanoGPT-
style 6-layer GPT (bench/models/gpt.py: eval forward, and a training step with AdamW), and
a tiny transformers Llama (forward, and `generate` of 8 tokens). shapeguard's extra per op
is reported as a ratio to the recorder-with-table floor's.

A trace or a guard replays a session that repeats an earlier one (`shapeguard/_trace/replay.py`:
recorded on the second call, replayed from the third), and the timed rounds follow
warm-up calls: the figures are the steady state of a forward that repeats, as in a test
suite or a training loop. The first trace of a model is in the "first trace" rows.
"""

import contextlib
import gc
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import tracemalloc
from dataclasses import dataclass, field

import _gc_counts
from _timing import (
    MIN_REPEATS,
    REPO,
    Section,
    Table,
    Target,
    Variant,
    compare,
    environ,
    fmt_seconds,
    load_file,
)

HERE = os.path.dirname(os.path.abspath(__file__))
STACK = os.path.join(HERE, "models", "llama70b_attention.py")

TINY_MHA = (2, 16, 64)  # batch, seq, d_model; 8 heads
MEDIUM_MHA = (8, 512, 512)
GPT_TINY = dict(n_layer=6, n_embd=128, n_head=4, block_size=64, vocab_size=65)
GPT_BATCH = (8, 64)
LLAMA = dict(
    vocab_size=100,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
LLAMA_INPUT = (3, 20)  # batch, seq (seq 16 = head_dim 16 at batch 2 hits a known warning)
DEPTHS = (2, 12, 48)
SUITE = (
    "tests/test_attention.py",
    "tests/test_composites.py",
    "tests/test_correct_models.py",
    "tests/test_guard.py",
    "tests/test_mask_rows.py",
    "tests/test_probes.py",
    "tests/test_silent_bugs.py",
)

# The rows of issue 16's Targets table, as the report names them (in its order).
TARGETS = (
    "extra per traced op, tiny Llama forward",
    "guard (every op), tiny Llama forward",
    "trace, GPT training step",
    "guard, tutorial MHA at (8, 512, 512)",
    'disabled guard, and check="first" after the first call',
    "memory per recorded event",
    "first trace through a new source file",
    "--device meta on the 80-layer stack",
    "compiled guarded module, steady state",
    "the project's own suite, plugin on vs off",
    "per-op cost vs depth",
)
# The targets of issue 16.
PER_OP_VS_FLOOR = 2.0  # shapeguard's extra per op over the recorder + weak table's
GUARD_LLAMA = 3.5
TRACE_TRAIN = 1.3
GUARD_MEDIUM = 1.05
HOOKS_PLUS_US = 5e-6
EVENT_KIB = 0.3
NEW_FILE_S = 5e-3
META_RATIO = 1.15
META_RSS = 1 << 30
COMPILED = 1.02
SUITE_CPU = 1.05
DEPTH_FLAT = 1.10


# -- the floors -----------------------------------------------------------------------------
def _floor_modes():
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils.weak import WeakTensorKeyDictionary

    skip = tuple(
        os.path.dirname(m.__file__) + os.sep
        for m in (torch, __import__("shapeguard"), sys.modules[__name__])
    )
    internal: dict = {}

    def user_frame(frame):
        while frame is not None:
            code = frame.f_code
            known = internal.get(code)
            if known is None:
                known = internal[code] = code.co_filename.startswith(skip)
            if not known:
                return frame
            frame = frame.f_back
        return None

    def tensors(out):
        if isinstance(out, torch.Tensor):
            return [out]
        if isinstance(out, tuple | list):
            return [t for t in out if isinstance(t, torch.Tensor)]
        return []

    class Bare(TorchFunctionMode):
        """Only calls the op: the price of a TorchFunctionMode."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Recorder(TorchFunctionMode):
        """The least a recording tool does: the caller's file:line, shapes in and out."""

        def __init__(self):
            super().__init__()
            self.events = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            outs = tensors(out)
            if not outs:
                return out
            frame = user_frame(sys._getframe(1))
            where = (frame.f_code.co_filename, frame.f_lineno) if frame is not None else None
            ins = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
            self.events.append((func, where, ins, [tuple(o.shape) for o in outs]))
            return out

    class RecorderWeak(Recorder):
        """The recorder plus a weak tensor -> record table, looked up per input."""

        def __init__(self):
            super().__init__()
            self.table = WeakTensorKeyDictionary()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            outs = tensors(out)
            if not outs:
                return out
            frame = user_frame(sys._getframe(1))
            where = (frame.f_code.co_filename, frame.f_lineno) if frame is not None else None
            ins = []
            for a in args:
                if isinstance(a, torch.Tensor):
                    self.table.get(a)
                    ins.append(tuple(a.shape))
            record = (func, where, ins, [tuple(o.shape) for o in outs])
            for o in outs:
                self.table[o] = record
            self.events.append(record)
            return out

    return Bare, Recorder, RecorderWeak


# -- workloads --------------------------------------------------------------------------------
@dataclass
class Workload:
    name: str
    size: str
    build: object  # () -> model, seeded: every variant gets the same weights
    call: object  # (model) -> None: one forward, training step or generate
    summary: object = None  # (model) -> None: torchinfo's per-call summary, when it applies
    guard_scope: str = "every op"  # what guard sees (a training step: the forward only)
    repeats: int = MIN_REPEATS
    warmup: int = 3
    min_sample_s: float = 0.02
    notes: list = field(default_factory=list)


def _no_grad(fn):
    import torch

    def run(model):
        with torch.no_grad():
            fn(model)

    return run


def _mha_workload(size, quick) -> Workload:
    import torch

    import shapeguard

    seed = load_file("examples/seed_mha.py", "_bench_seed_mha")
    b, s, d = size

    def build():
        torch.manual_seed(0)
        return shapeguard.unguard(seed.MultiHeadAttention(d_model=d, n_heads=8)).eval()

    torch.manual_seed(1)
    x = torch.randn(b, s, d)
    mask = torch.tril(torch.ones(s, s, dtype=torch.bool)).expand(b, 1, s, s)
    medium = size == MEDIUM_MHA
    return Workload(
        "tutorial MHA (examples/seed_mha.py)",
        f"{'medium' if medium else 'tiny'} (B={b}, S={s}, D={d})",
        build,
        _no_grad(lambda m: m(x, mask=mask)),
        summary=lambda m: _torchinfo(m, (x,), {"mask": mask}),
        repeats=3 if quick else (10 if medium else MIN_REPEATS),
        warmup=3,
        min_sample_s=0.0 if quick or medium else 0.02,
    )


def _gpt_model(**config):
    gpt = load_file("bench/models/gpt.py", "_bench_gpt")
    return gpt.GPT(**config)


def _gpt_workloads(quick) -> list[Workload]:
    import torch

    b, t = (2, 16) if quick else GPT_BATCH
    torch.manual_seed(1)
    idx = torch.randint(0, GPT_TINY["vocab_size"], (b, t))
    targets = torch.randint(0, GPT_TINY["vocab_size"], (b, t))
    config = dict(GPT_TINY, n_layer=2) if quick else GPT_TINY

    def build():
        torch.manual_seed(0)
        return _gpt_model(**config).eval()

    def build_train():
        torch.manual_seed(0)
        model = _gpt_model(**config).train()
        model._bench_optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return model

    def step(model):
        optimizer = model._bench_optimizer
        optimizer.zero_grad(set_to_none=True)
        loss = model(idx, targets)
        loss.backward()
        optimizer.step()

    layers = config["n_layer"]
    return [
        Workload(
            f"GPT ({layers} layers, nanoGPT-style), forward",
            f"tiny (B={b}, T={t}, C={config['n_embd']})",
            build,
            _no_grad(lambda m: m(idx)),
            summary=lambda m: _torchinfo(m, (idx,), {}),
            repeats=3 if quick else MIN_REPEATS,
            min_sample_s=0.0 if quick else 0.02,
        ),
        Workload(
            f"GPT ({layers} layers), training step (AdamW)",
            f"tiny (B={b}, T={t}, C={config['n_embd']})",
            build_train,
            step,
            guard_scope="the forward's ops",
            repeats=3 if quick else MIN_REPEATS,
            min_sample_s=0.0 if quick else 0.02,
            notes=[
                "trace: the whole step inside one `with shapeguard.trace():`; the ops "
                "torch.optim makes itself run unrecorded (the floors record them, so "
                "they are ops in the floors' columns and not in the trace's)"
            ],
        ),
    ]


def _llama_workloads(quick) -> list[Workload]:
    import torch

    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return []
    config = LlamaConfig(**LLAMA)
    b, s = LLAMA_INPUT
    torch.manual_seed(1)
    ids = torch.randint(3, LLAMA["vocab_size"], (b, s))

    def build():
        torch.manual_seed(0)
        return LlamaForCausalLM._from_config(config, attn_implementation="sdpa").eval()

    mask = torch.ones_like(ids)  # given, so that transformers does not warn every call

    def generate(model):
        with torch.no_grad(), warnings_off():
            model.generate(
                ids,
                attention_mask=mask,
                pad_token_id=0,
                max_new_tokens=8,
                min_new_tokens=8,
                do_sample=False,
            )

    size = f"tiny (hidden 64, 2 layers, 4/2 heads; B={b}, S={s})"
    return [
        Workload(
            "transformers Llama, forward",
            size,
            build,
            _no_grad(lambda m: m(ids)),
            summary=lambda m: _torchinfo(m, (ids,), {}),
            repeats=3 if quick else MIN_REPEATS,
            min_sample_s=0.0 if quick else 0.02,
        ),
        Workload(
            "transformers Llama, generate(8)",
            size,
            build,
            generate,
            guard_scope="the model's forwards",
            repeats=2 if quick else MIN_REPEATS,
            min_sample_s=0.0 if quick else 0.02,
        ),
    ]


@contextlib.contextmanager
def warnings_off():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _torchinfo(model, args, kwargs):
    from torchinfo import summary

    with warnings_off():
        summary(model, input_data=list(args), verbose=0, **kwargs)


def _has_torchinfo() -> bool:
    import importlib.util

    return importlib.util.find_spec("torchinfo") is not None


# -- measuring one workload -------------------------------------------------------------------
FLOOR_VARIANTS = ("plain", "bare mode", "recorder", "recorder + weak table")


def _variants(w: Workload):
    import shapeguard

    Bare, Recorder, RecorderWeak = _floor_modes()
    plain = w.build()
    guarded = shapeguard.guard(w.build())
    call = w.call

    def under(mode_cls):
        def run():
            with mode_cls():
                call(plain)

        return run

    def traced():
        with shapeguard.trace():
            call(plain)

    variants = [
        Variant("plain", lambda: call(plain)),
        Variant("bare mode", under(Bare)),
        Variant("recorder", under(Recorder)),
        Variant("recorder + weak table", under(RecorderWeak)),
    ]
    if w.summary is not None and _has_torchinfo():
        variants.append(Variant("torchinfo.summary", lambda: w.summary(plain)))
    variants += [Variant("shapeguard.trace", traced), Variant("guard", lambda: call(guarded))]
    return variants, plain, guarded


def _ops(w: Workload, plain, guarded) -> tuple[int, int, int]:
    """Ops a trace records for one call, those the guard sees (summed over the forwards
    of a generate loop: it opens a trace per forward), and those the recorder floor
    records (every op with a tensor output: a training step's include torch.optim's,
    which a trace runs unrecorded)."""
    import shapeguard

    with shapeguard.trace() as t:
        w.call(plain)
    recorder = _floor_modes()[1]()
    with recorder:
        w.call(plain)
    counts = []

    def count(module, args, output):
        seen = shapeguard.last_trace(guarded)
        counts.append(len(seen.events) if seen is not None else 0)

    hook = guarded.register_forward_hook(count)  # after the guard's own: its trace is done
    try:
        w.call(guarded)
    finally:
        hook.remove()
    return max(1, len(t.events)), max(1, sum(counts)), max(1, len(recorder.events))


@dataclass
class Measured:
    workload: Workload
    timings: dict
    ops: int  # recorded by a trace
    guard_ops: int  # seen by the guard
    floor_ops: int  # recorded by the floors

    def extra(self, name: str) -> float:
        """Median per-round difference to plain, seconds per call."""
        base = self.timings["plain"]
        mine = self.timings[name]
        return statistics.median(m - b for m, b in zip(mine.samples, base.samples, strict=True))

    def per_op(self, name: str) -> float:
        """The extra per op each variant records (the floors' and torchinfo's: the floor's
        count)."""
        ops = {"guard": self.guard_ops, "shapeguard.trace": self.ops}.get(name, self.floor_ops)
        return self.extra(name) / ops


def measure(w: Workload) -> Measured:
    variants, plain, guarded = _variants(w)
    ops, guard_ops, floor_ops = _ops(w, plain, guarded)
    timings = compare(variants, repeats=w.repeats, warmup=w.warmup, min_sample_s=w.min_sample_s)
    return Measured(w, timings, ops, guard_ops, floor_ops)


# -- other figures ----------------------------------------------------------------------------
def hooks_floor(quick: bool) -> dict:
    """A switched-off guard and check="first" after its first call, against two empty
    module hooks as guard installs them (the floor of any per-call switch)."""
    import torch

    import shapeguard

    seed = load_file("examples/seed_mha.py", "_bench_seed_mha")
    b, s, d = TINY_MHA

    def build():
        torch.manual_seed(0)
        return shapeguard.unguard(seed.MultiHeadAttention(d_model=d, n_heads=8)).eval()

    x = torch.randn(b, s, d)
    plain, hooked = build(), build()
    hooked.register_forward_pre_hook(lambda m, a, k: None, with_kwargs=True)
    hooked.register_forward_hook(lambda m, a, k, o: None, with_kwargs=True, always_call=True)
    off = shapeguard.guard(build())
    first = shapeguard.guard(build(), check="first")

    def call(model):
        def run():
            with torch.no_grad():
                model(x)

        return run

    timings = compare(
        [
            Variant("plain", call(plain)),
            Variant("two empty hooks", call(hooked)),
            Variant("disabled guard", call(off), context=lambda: environ("SHAPEGUARD", "0")),
            Variant('check="first"', call(first)),
        ],
        repeats=3 if quick else 30,
        min_sample_s=0.0 if quick else 0.02,
    )
    base = timings["two empty hooks"]
    return {
        name: statistics.median(
            m - h for m, h in zip(timings[name].samples, base.samples, strict=True)
        )
        for name in ("disabled guard", 'check="first"')
    } | {"plain": timings["plain"].seconds, "hooks": base.seconds - timings["plain"].seconds}


def event_memory(quick: bool) -> dict:
    """Bytes a long trace keeps per event (tracemalloc, after a collection)."""
    import torch

    import shapeguard

    forwards = 2 if quick else 20
    model = _gpt_model(**dict(GPT_TINY, n_layer=2)).eval()
    idx = torch.randint(0, GPT_TINY["vocab_size"], (2, 16))
    with torch.no_grad():
        shapeguard.trace(model, idx)  # the sites and what they parse: cached, not per event
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        with torch.no_grad(), shapeguard.trace() as trace:
            for _ in range(forwards):
                model(idx)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
        count = trace.event_count
        _ = trace.events  # built on read: the records a report reads
        gc.collect()
        built = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return {"events": count, "kept": kept / count, "built": built / count, "forwards": forwards}


_NEW_FILE = """
import math
import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, d_model=64, n_heads=8):
        super().__init__()
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, S, _ = x.shape
        Q = self.W_q(x).view(B, S, self.n_heads, self.d_k).transpose(1, 2)
        K = self.W_k(x).view(B, S, self.n_heads, self.d_k).transpose(1, 2)
        V = self.W_v(x).view(B, S, self.n_heads, self.d_k).transpose(1, 2)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)
        attn = F.softmax(scores, dim=-1)
        context = (attn @ V).transpose(1, 2).reshape(B, S, self.d_model)
        return self.W_o(context)
"""


def new_file_cost(quick: bool) -> dict:
    """The first trace of a model from a source file shapeguard has not read, over a first
    trace of a new instance of a class whose file it has read: one file's parsing and
    sites. Both are first traces (nothing replayed)."""
    import importlib.util

    import torch
    from _timing import CLOCKS, clock_name

    import shapeguard

    clock = CLOCKS[clock_name()]
    x = torch.randn(2, 16, 64)
    rounds = 3 if quick else 15
    cold, warm = [], []
    with tempfile.TemporaryDirectory() as folder:
        for r in range(rounds):
            path = os.path.join(folder, f"fresh_model_{r}.py")
            with open(path, "w", encoding="utf-8") as f:
                f.write(textwrap.dedent(_NEW_FILE))
            spec = importlib.util.spec_from_file_location(f"_bench_fresh_{r}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            first, second = module.Attention().eval(), module.Attention().eval()
            with torch.no_grad():
                start = clock()
                shapeguard.trace(first, x)
                cold.append(clock() - start)
                start = clock()
                shapeguard.trace(second, x)
                warm.append(clock() - start)
    extra = [c - w for c, w in zip(cold, warm, strict=True)]
    return {"extra": statistics.median(extra), "cold": statistics.median(cold),
            "warm": statistics.median(warm), "rounds": rounds}  # fmt: skip


_PLAIN_META = """
import resource, sys, time
start = time.process_time()
import torch
sys.path.insert(0, {folder!r})
import llama70b_attention as m
layers = {layers!r}
with torch.device("meta"):
    model = m.Llama70BStack(**({{}} if layers is None else {{"n_layers": layers}}))
x = torch.empty(m.BATCH, m.SEQ, m.D_MODEL, dtype=m.DTYPE, device="meta")
with torch.no_grad():
    model(x)
"""


def _child_env() -> dict:
    """This checkout first on the path: the child measures this shapeguard."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    return env


def _child(command: list[str]) -> tuple[float, int]:
    """CPU seconds (user + system) and peak RSS of one subprocess."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, cwd=REPO, env=_child_env()
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0,):
        raise RuntimeError(
            f"{' '.join(command[:4])} exited {done.returncode}: {done.stderr[-2000:]}"
        )
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, after.ru_maxrss * 1024


def meta_stack(quick: bool) -> dict:
    """`shapeguard trace --device meta` on the stack against the same model built and run
    on meta in a fresh python (each a new process: torch's import is in both)."""
    layers = 1 if quick else None
    plain = [sys.executable, "-c", _PLAIN_META.format(folder=os.path.dirname(STACK), layers=layers)]
    cli = [sys.executable, "-m", "shapeguard", "trace", STACK, "--device", "meta"]
    if layers is not None:
        cli += ["--arg", f"n_layers={layers}"]
    rounds = 1 if quick else 3
    plain_cpu, cli_cpu, peak = [], [], 0
    for _ in range(rounds):
        cpu, _rss = _child(plain)
        plain_cpu.append(cpu)
        cpu, rss = _child(cli)
        cli_cpu.append(cpu)
        peak = max(peak, rss)
    ratios = [c / p for c, p in zip(cli_cpu, plain_cpu, strict=True)]
    return {
        "plain": statistics.median(plain_cpu),
        "cli": statistics.median(cli_cpu),
        "ratio": statistics.median(ratios),
        "peak_rss": peak,
        "layers": 80 if layers is None else layers,
        "rounds": rounds,
    }


def _passing_forward(forward):
    """A forward that calls `forward` and does nothing else: what wrapping costs."""

    def wrapper(*args, **kwargs):
        return forward(*args, **kwargs)

    return wrapper


def compiled(quick: bool) -> dict:
    """A compiled guarded module against the same module compiled unguarded, both warm."""
    import torch

    import shapeguard

    seed = load_file("examples/seed_mha.py", "_bench_seed_mha")
    b, s, d = TINY_MHA

    def build():
        torch.manual_seed(0)
        return shapeguard.unguard(seed.MultiHeadAttention(d_model=d, n_heads=8)).eval()

    x = torch.randn(b, s, d)
    plain = torch.compile(build(), backend="eager", fullgraph=True)
    hooked = build()  # the floor of any hook-based check under compile
    hooked.register_forward_pre_hook(lambda m, a, k: None, with_kwargs=True)
    hooked.register_forward_hook(lambda m, a, k, o: None, with_kwargs=True, always_call=True)
    hooked = torch.compile(hooked, backend="eager", fullgraph=True)
    # The floor of a check that wraps forward instead (dynamo inlines the wrapper).
    wrapped = build()
    wrapped.forward = _passing_forward(wrapped.forward)
    wrapped = torch.compile(wrapped, backend="eager", fullgraph=True)
    guarded = torch.compile(shapeguard.guard(build()), backend="eager", fullgraph=True)

    def call(model):
        def run():
            with torch.no_grad():
                model(x)

        return run

    timings = compare(
        [
            Variant("compiled", call(plain)),
            Variant("compiled, two empty hooks", call(hooked)),
            Variant("compiled, a forward wrapper", call(wrapped)),
            Variant("compiled, guarded", call(guarded)),
        ],
        # A 100 us call whose difference to the floor is a percent or two: 30 rounds moved
        # its median by 3% from one run to the next, 100 (some 10 s) hold it within one.
        repeats=3 if quick else 100,
        warmup=3,
        min_sample_s=0.0 if quick else 0.02,
    )
    torch._dynamo.reset()
    t, h = timings["compiled, guarded"], timings["compiled, two empty hooks"]
    return {"ratio": t.ratio, "q1": t.ratio_q1, "q3": t.ratio_q3,
            "compiled": timings["compiled"].seconds, "hooks": h.ratio,
            "wrapper": timings["compiled, a forward wrapper"].ratio}  # fmt: skip


def suite_cpu(quick: bool) -> dict:
    """pytest over test files the project's plugin traces, plugin on (the project's own
    setting) and off (`-o shapeguard=false`: installed, not asked), CPU of the subprocess,
    and how often the collector ran in each (`_gc_counts`: the same whatever the machine's
    speed)."""
    files = list(SUITE[:1] if quick else SUITE)
    # This checkout's plugin, by module, whatever an installed copy's entry points name.
    plugin = ["-p", "no:shapeguard", "-p", "no:shapeguard_ini"]
    plugin += ["-p", "shapeguard._plugin.ini", "-p", "shapeguard._plugin.plugin"]
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    base += plugin + ["-p", "_gc_counts"]
    on, off = base + files, base + ["-o", "shapeguard=false"] + files
    # Five pairs: a machine whose speed drifts by a few percent over a minute moves one
    # pair's ratio by as much as the target's margin (pairs of one run have read +1.5% to
    # +7.1%); the median of five holds better, and the table shows every pair's.
    rounds = 1 if quick else 5
    cpu_on, cpu_off, gc_on, gc_off = [], [], [], []
    for _ in range(rounds):
        cpu, counts = _child_cpu(off)
        cpu_off.append(cpu)
        gc_off.append(counts)
        cpu, counts = _child_cpu(on)
        cpu_on.append(cpu)
        gc_on.append(counts)
    ratios = [a / b for a, b in zip(cpu_on, cpu_off, strict=True)]
    return {"on": statistics.median(cpu_on), "off": statistics.median(cpu_off),
            "ratio": statistics.median(ratios), "ratios": ratios, "files": files,
            "rounds": rounds, "gc_on": gc_on, "gc_off": gc_off}  # fmt: skip


def _collections(suite: dict) -> dict:
    """The suite's collections as the report shows them: each side's median run by
    generation, and "on N vs off M" of the full ones."""

    def median_run(runs: list) -> tuple[int, ...] | None:
        found = sorted(r for r in runs if r is not None)
        return found[len(found) // 2] if found else None

    off, on = median_run(suite["gc_off"]), median_run(suite["gc_on"])

    def show(counts) -> str:
        return ", ".join(f"{n:,}" for n in counts) if counts else "n/a"

    full = f"on {on[-1]} vs off {off[-1]}" if on and off else "n/a"
    return {"off": show(off), "on": show(on), "full": full}


def _child_cpu(command) -> tuple[float, tuple[int, ...] | None]:
    """CPU seconds of one pytest subprocess, and the collections it made by generation
    (`_gc_counts`, loaded from bench/; None when its line is missing)."""
    env = _child_env()
    env["PYTHONPATH"] = os.pathsep.join((os.path.dirname(__file__), env["PYTHONPATH"]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        output = (done.stdout + done.stderr)[-1500:]
        raise RuntimeError(f"pytest exited {done.returncode}: {output}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, _gc_counts.parse(done.stdout + done.stderr)


def depth(quick: bool) -> dict:
    """shapeguard's extra per op in a traced GPT forward at 2, 12 and 48 layers, and the
    recorder + weak table floor's, all timed side by side in one `compare` (interleaved
    rounds: a machine that slows down for a while slows every depth alike), then again with
    the collector off. Layer -> (per op, ops, the floor's per op, per op with gc off)."""
    import torch

    import shapeguard

    depths = DEPTHS[:2] if quick else DEPTHS
    idx = torch.randint(0, GPT_TINY["vocab_size"], (2, 16))
    recorder = _floor_modes()[2]  # the recorder + weak table, in the same rounds
    variants, ops = [], {}
    for layers in depths:
        torch.manual_seed(0)
        model = _gpt_model(**dict(GPT_TINY, n_layer=layers)).eval()

        def plain(model=model):
            with torch.no_grad():
                model(idx)

        def traced(model=model):
            with torch.no_grad(), shapeguard.trace():
                model(idx)

        def floor(model=model):
            with torch.no_grad(), recorder():
                model(idx)

        with torch.no_grad():
            ops[layers] = len(shapeguard.trace(model, idx).events)
        variants += [
            Variant(f"plain {layers}", plain),
            Variant(f"trace {layers}", traced),
            Variant(f"floor {layers}", floor),
        ]
    rounds = dict(warmup=3, min_sample_s=0.0 if quick else 0.05)
    timings = compare(variants, repeats=3 if quick else 30, **rounds)
    # The same rounds with the collector off for the whole compare (off for one variant
    # only would hand its garbage to the next one): what is left is the per-op work.
    gc.collect()
    collecting = gc.isenabled()
    gc.disable()
    try:
        quiet = compare(variants, repeats=3 if quick else 15, **rounds)
    finally:
        if collecting:
            gc.enable()

    def rounds(timed, kind: str, layers: int) -> list[float]:
        """The extra per op of each round (a round times every depth, interleaved)."""
        base, mine = timed[f"plain {layers}"].samples, timed[f"{kind} {layers}"].samples
        return [(m - b) / ops[layers] for m, b in zip(mine, base, strict=True)]

    return {
        n: (statistics.median(rounds(timings, "trace", n)), ops[n],
            statistics.median(rounds(timings, "floor", n)),
            statistics.median(rounds(quiet, "trace", n)),
            rounds(timings, "trace", n), rounds(timings, "floor", n))
        for n in depths
    }  # fmt: skip


def paired_spread(by_depth: list[list[float]]) -> float:
    """How far the per-op cost of one depth is from another's, as `_timing.compare` makes
    every ratio: per round (in which every depth ran), then the median over the rounds; the
    largest of these over every pair of depths, either way round. A machine whose speed
    drifts between rounds (this one's per-op figures move by a third from one compare to
    the next) moves the medians of separate depths apart, not a ratio within a round."""
    worst = 1.0
    for a in by_depth:
        for b in by_depth:
            if a is b:
                continue
            ratios = [x / y for x, y in zip(a, b, strict=True) if y > 0 and x > 0]
            if ratios:
                worst = max(worst, statistics.median(ratios))
    return worst


# -- the profile ------------------------------------------------------------------------------
PROFILE_TOP = 14


def _short(func: tuple) -> str:
    """pstats' (file, line, name) as `shapeguard/_trace/session.py:812(_record)`."""
    filename, line, name = func
    if filename == "~":
        return name  # a builtin: `<method 'get' of 'dict' objects>`
    parts = filename.replace(os.sep, "/").split("/")
    for root in ("shapeguard", "torch", "transformers"):
        if root in parts:
            parts = parts[len(parts) - 1 - parts[::-1].index(root) :]
            break
    else:
        parts = parts[-2:]
    return f"{'/'.join(parts)}:{line}({name})"


def profile_per_op(quick: bool) -> dict:
    """cProfile of shapeguard's per-op path on the tiny Llama forward (the tiny GPT when
    transformers is missing): replayed forwards (the steady state), and first traces (a
    model traced once, as a test does). Entries by own time per traced op; cProfile's
    own cost inflates every entry, so read the shares, not the microseconds."""
    import cProfile
    import pstats

    import shapeguard

    workloads = _llama_workloads(quick)[:1] or _gpt_workloads(quick)[:1]
    w = workloads[0]
    forwards = 3 if quick else 30
    found = {"workload": w.name, "forwards": forwards}
    for kind in ("replayed", "first trace"):
        # First traces: a new model each (and one more to count the ops on).
        models = [w.build() for _ in range(forwards + 1 if kind == "first trace" else 1)]

        def traced(model):
            # One `with` line for the warm-up and the profiled calls: a session without a
            # module is replayed by the line that opened it.
            with shapeguard.trace() as t:
                w.call(model)
            return t

        if kind == "replayed":
            for _ in range(3):  # recorded on the second session, replayed from the third
                traced(models[0])
        ops = max(1, len(traced(models[-1]).events))
        profiler = cProfile.Profile()
        # A first trace neither replays nor records (a test traces its model once): replay
        # off, else these sessions, all opened on one line, would record each other.
        switch = environ("SHAPEGUARD_REPLAY", "0") if kind == "first trace" else _nothing()
        # The collector off while profiling: a collection's time lands on whichever function
        # allocated when it ran (a full one in this process takes tens of ms), not on what
        # the function does. Its share is in the timed rows, which run with it on.
        gc.collect()
        collecting = gc.isenabled()
        gc.disable()
        try:
            with switch:
                for i in range(forwards):
                    model = models[0] if kind == "replayed" else models[i]
                    profiler.enable()
                    traced(model)
                    profiler.disable()
        finally:
            if collecting:
                gc.enable()
        stats = pstats.Stats(profiler)
        total_calls = sum(v[1] for v in stats.stats.values())
        rows = []
        per = 1e6 / (forwards * ops)
        for func, (_cc, nc, tt, ct, _callers) in stats.stats.items():
            rows.append((tt, func, nc, ct))
        rows.sort(key=lambda r: r[0], reverse=True)
        all_tt = sum(r[0] for r in rows) or 1.0
        found[kind] = {
            "ops": ops,
            "calls_per_op": total_calls / (forwards * ops),
            "us_per_op": all_tt * per,
            "top": [
                (_short(func), nc / (forwards * ops), tt * per, ct * per, tt / all_tt)
                for tt, func, nc, ct in rows[:PROFILE_TOP]
            ],
        }
    return found


_KINDS = {
    "replayed": "replayed (the steady state of a forward that repeats)",
    "first trace": "first traces (replay off: each session neither records nor replays)",
}


@contextlib.contextmanager
def _nothing():
    yield


def _profile_tables(prof: dict) -> list[Table]:
    tables = []
    for kind in ("replayed", "first trace"):
        p = prof[kind]
        tables.append(
            Table(
                f"Where a traced op's time goes: {prof['workload']}, {_KINDS[kind]} "
                f"(cProfile, {prof['forwards']} forwards of {p['ops']} ops)",
                ["function", "calls per op", "own us per op", "cumulative us per op", "share"],
                [
                    [f"`{name}`", f"{calls:.2f}", f"{own:.2f}", f"{cum:.2f}", f"{share:.0%}"]
                    for name, calls, own, cum, share in p["top"]
                ],
                [
                    f"{p['calls_per_op']:.0f} Python calls per traced op, {p['us_per_op']:.0f} us "
                    "of profiled time per op (plain ops included; cProfile inflates small "
                    "calls most), the collector off. Own time: in the function itself; "
                    "cumulative: with its callees."
                ],
            )
        )
    return tables


def _top(prof: dict, kind: str, n: int = 3) -> str:
    """The first entries of a profile, for a missed target's note."""
    top = prof[kind]["top"][:n]
    return ", ".join(f"{name} {share:.0%}" for name, _c, _o, _cum, share in top)


# -- the report -------------------------------------------------------------------------------
def _ratio(t) -> str:
    return f"{t.ratio:.2f}x ({t.ratio_q1:.2f}-{t.ratio_q3:.2f})"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:+.1f} us"


def _skipped(title: str) -> Table:
    return Table(title, ["figure"], [["not measured in quick mode (subprocesses)"]])


def run(quick: bool = False) -> Section:
    """Every figure and target of this piece. `quick`: tiny sizes, 2-3 rounds."""
    from _timing import one_thread

    one_thread()
    workloads = [_mha_workload(TINY_MHA, quick)]
    if not quick:
        workloads.append(_mha_workload(MEDIUM_MHA, quick))
    workloads += _gpt_workloads(quick) + _llama_workloads(quick)
    measured = [measure(w) for w in workloads]
    prof = profile_per_op(quick)

    names = [*FLOOR_VARIANTS, "torchinfo.summary", "shapeguard.trace", "guard"]
    rows, per_op_rows = [], []
    for m in measured:
        t = m.timings
        rows.append(
            [m.workload.name, m.workload.size, fmt_seconds(t["plain"].seconds)]
            + [_ratio(t[n]) if n in t else "n/a" for n in names[1:]]
        )
        floor = m.per_op("recorder + weak table")
        per_op_rows.append(
            [m.workload.name, m.workload.size, str(m.ops), str(m.guard_ops), str(m.floor_ops)]
            + [_us(m.per_op(n)) if n in t else "n/a" for n in names[1:]]
            + [
                f"{m.per_op('shapeguard.trace') / floor:.2f}x" if floor > 0 else "n/a",
                f"{m.per_op('guard') / floor:.2f}x" if floor > 0 else "n/a",
            ]
        )
    tables = [
        Table(
            "Per call, as a ratio to the plain call (IQR)",
            ["workload", "size", "plain", *names[1:]],
            rows,
            [
                "Side by side in one process, one thread, thread CPU time, interleaved rounds "
                "after warm-up. Training step: train mode, autograd on, AdamW; `guard` checks "
                "the forward, the others see the whole step. generate: greedy, 8 new tokens.",
            ],
        ),
        Table(
            "Extra per op, and shapeguard's as a ratio to the recorder + weak table floor",
            [
                "workload",
                "size",
                "ops (trace)",
                "ops (guard)",
                "ops (floors)",
                *names[1:],
                "trace / floor",
                "guard / floor",
            ],
            per_op_rows,
            [
                "Median of the per-round differences to the plain call, divided by the ops "
                "each records: a trace's, the guard's (the ops it sees), the floors' (every "
                "op with a tensor output; torchinfo's column too). A training step's floors "
                "record torch.optim's ops, which a trace runs unrecorded. 'floor' is the "
                "recorder with a weak table: what any tool that names tensors pays at least.",
            ],
        ),
    ]
    tables += _profile_tables(prof)
    targets = []
    by_name = {m.workload.name: m for m in measured}
    llama = by_name.get("transformers Llama, forward")
    if llama is not None:
        floor = llama.per_op("recorder + weak table")
        mine = llama.per_op("shapeguard.trace")
        ratio = mine / floor if floor > 0 else float("inf")
        targets.append(
            Target(
                "extra per traced op, tiny Llama forward",
                f"<= {PER_OP_VS_FLOOR:.0f}x the recorder + weak table floor",
                f"{ratio:.2f}x ({_us(mine)} vs {_us(floor)})",
                ratio <= PER_OP_VS_FLOOR,
                f"{_us(mine - floor)} per op above the floor; by own time (profile, replayed): "
                + _top(prof, "replayed"),
            )
        )
        g = llama.timings["guard"]
        targets.append(
            Target(
                "guard (every op), tiny Llama forward",
                f"<= {GUARD_LLAMA}x plain",
                _ratio(g),
                g.ratio <= GUARD_LLAMA,
                f"{_us(llama.per_op('guard'))} per op on ops of "
                f"{fmt_seconds(llama.timings['plain'].seconds / llama.ops)} each; "
                + _top(prof, "replayed"),
            )
        )
    train = next((m for m in measured if "training step" in m.workload.name), None)
    if train is not None:
        t = train.timings["shapeguard.trace"]
        targets.append(
            Target(
                "trace, GPT training step",
                f"<= {TRACE_TRAIN}x plain",
                _ratio(t),
                t.ratio <= TRACE_TRAIN,
                f"{_us(train.per_op('shapeguard.trace'))} per recorded op over {train.ops} "
                "recorded ops (replayed: the same path as the Llama rows), and the pass of "
                "torch.optim's own ops, which run unrecorded; the floors, which record "
                f"those too: recorder {train.timings['recorder'].ratio:.2f}x, recorder + "
                f"weak table {train.timings['recorder + weak table'].ratio:.2f}x",
            )
        )
    medium = next((m for m in measured if m.workload.size.startswith("medium")), None)
    if medium is not None:
        g = medium.timings["guard"]
        targets.append(
            Target(
                "guard, tutorial MHA at (8, 512, 512)",
                f"<= {GUARD_MEDIUM}x",
                _ratio(g),
                g.ratio <= GUARD_MEDIUM,
                "within this run's noise"
                if g.ratio_q1 <= GUARD_MEDIUM
                else f"{_us(medium.per_op('guard'))} per op",
            )
        )

    hooks = hooks_floor(quick)
    hook_rows = [
        [name, _us(hooks[name]), "met" if hooks[name] <= HOOKS_PLUS_US else "missed"]
        for name in ("disabled guard", 'check="first"')
    ]
    tables.append(
        Table(
            "A guard that checks nothing, per call, over two empty module hooks",
            ["variant", "extra per call over two empty hooks", ""],
            hook_rows,
            [
                f"Tutorial MHA, tiny; the two empty hooks themselves cost {_us(hooks['hooks'])} "
                f"per call on a {fmt_seconds(hooks['plain'])} forward."
            ],
        )
    )
    off, first = hooks["disabled guard"], hooks['check="first"']
    targets.append(
        Target(
            'disabled guard, and check="first" after the first call',
            "<= two empty hooks + 5 us per call",
            f"disabled {_us(off)}, first {_us(first)}",
            max(off, first) <= HOOKS_PLUS_US,
            "the hooks' own code: the off switch, the signature lookup",
        )
    )

    memory = event_memory(quick)
    tables.append(
        Table(
            "Memory a long trace keeps per event (tracemalloc)",
            ["forwards in one trace", "events", "as recorded", "after reading `events`"],
            [
                [
                    str(memory["forwards"]),
                    str(memory["events"]),
                    f"{memory['kept'] / 1024:.2f} KiB",
                    f"{memory['built'] / 1024:.2f} KiB",
                ]
            ],
            ["GPT, 2 layers, B=2, T=16; everything the trace holds after a collection."],
        )
    )
    targets.append(
        Target(
            "memory per recorded event",
            f"<= {EVENT_KIB} KiB",
            f"{memory['kept'] / 1024:.2f} KiB ({memory['built'] / 1024:.2f} KiB once read)",
            memory["kept"] / 1024 <= EVENT_KIB,
            "each output's meta and its axes' dims, kept for the names read at the end",
        )
    )

    fresh = new_file_cost(quick)
    tables.append(
        Table(
            "First trace through a new source file",
            [
                "first trace, new file",
                "first trace, file read before",
                "the file's share",
                "rounds",
            ],
            [
                [
                    fmt_seconds(fresh["cold"]),
                    fmt_seconds(fresh["warm"]),
                    fmt_seconds(fresh["extra"]),
                    str(fresh["rounds"]),
                ]
            ],
            ["A 20-line attention module (one file, 15 ops), first traced each time."],
        )
    )
    targets.append(
        Target(
            "first trace through a new source file",
            "<= 5 ms per file on top of the ops",
            fmt_seconds(fresh["extra"]),
            fresh["extra"] <= NEW_FILE_S,
            "parsing the functions the file's sites are in, and building the sites",
        )
    )

    if quick:  # fresh interpreters importing torch: most of a smoke run's time
        tables.append(_skipped("`shapeguard trace --device meta` against a plain meta forward"))
    else:
        meta = meta_stack(quick)
        tables.append(
            Table(
                "`shapeguard trace --device meta` against a plain meta forward (fresh processes)",
                [
                    "layers",
                    "plain meta forward, CPU",
                    "shapeguard trace, CPU",
                    "ratio",
                    "peak RSS",
                    "rounds",
                ],  # fmt: skip
                [
                    [
                        str(meta["layers"]),
                        f"{meta['plain']:.2f} s",
                        f"{meta['cli']:.2f} s",
                        f"{meta['ratio']:.3f}x",
                        f"{meta['peak_rss'] / (1 << 20):,.0f} MiB",
                        str(meta["rounds"]),
                    ]
                ],
                [
                    "Both import torch and run torch's own meta kernels; the difference is shapeguard's."
                ],
            )
        )
        targets.append(
            Target(
                "--device meta on the 80-layer stack",
                f"<= {META_RATIO}x a plain meta forward; peak RSS < 1 GiB",
                f"{meta['ratio']:.3f}x; {meta['peak_rss'] / (1 << 20):,.0f} MiB",
                meta["ratio"] <= META_RATIO and meta["peak_rss"] < META_RSS,
                "the traced forward (a first trace: nothing to replay) and the report; "
                "first-trace profile: " + _top(prof, "first trace"),
            )
        )

    comp = compiled(quick)
    tables.append(
        Table(
            "A compiled guarded module, steady state (backend='eager', fullgraph=True)",
            ["compiled alone", "compiled with two empty hooks, ratio", "compiled with a forward wrapper, ratio", "compiled and guarded, ratio (IQR)"],
            [[fmt_seconds(comp["compiled"]), f"{comp['hooks']:.3f}x", f"{comp['wrapper']:.3f}x", f"{comp['ratio']:.3f}x ({comp['q1']:.3f}-{comp['q3']:.3f})"]],
            ["Tutorial MHA, tiny. The check ran once, while dynamo traced; the graph has nothing of shapeguard's. "
             "Two empty hooks on the same module, compiled: what nn.Module's hook path and dynamo's guards on the hooks cost any hook-based tool; "
             "a forward wrapper (an instance attribute that calls forward), compiled: the floor of the guard, which wraps forward."],
        )
    )  # fmt: skip
    targets.append(
        Target(
            "compiled guarded module, steady state",
            f"<= {COMPILED}x the compiled module alone",
            f"{comp['ratio']:.3f}x ({comp['q1']:.3f}-{comp['q3']:.3f})",
            comp["ratio"] <= COMPILED,
            f"the guard's forward wrapper, inlined by dynamo: a bare forward wrapper costs "
            f"{comp['wrapper']:.3f}x in the same run, two empty module hooks (what the guard "
            f"used before) {comp['hooks']:.3f}x",
        )
    )

    if quick:
        tables.append(_skipped("The project's tests, plugin on vs off"))
    else:
        suite = suite_cpu(quick)
        collections = _collections(suite)
        tables.append(
            Table(
                "The project's tests, plugin on vs off (CPU of the pytest process)",
                ["files", "plugin off", "plugin on", "ratio", "each pair", "rounds",
                 "collections off (young, middle, full)", "collections on"],
                [[", ".join(os.path.basename(f) for f in suite["files"]), f"{suite['off']:.1f} s",
                  f"{suite['on']:.1f} s", f"{suite['ratio']:.3f}x",
                  ", ".join(f"{r:.3f}" for r in suite["ratios"]), str(suite["rounds"]),
                  collections["off"], collections["on"]]],
                ["The test files the plugin traces (the others opt out with no_shapeguard); "
                 "off: `-o shapeguard=false`, the plugin installed and not asked. Medians of "
                 "the rounds, each an off run then an on run; the ratio is the median pair's. "
                 "Collections: what the collector ran in each run (`gc.get_stats()`, the "
                 "median run's), which the machine's speed does not move; a full one walks "
                 "every object of the process."],
            )
        )  # fmt: skip
        targets.append(
            Target(
                "the project's own suite, plugin on vs off",
                "<= 5% CPU",
                f"{(suite['ratio'] - 1) * 100:+.1f}% (pairs {(min(suite['ratios']) - 1) * 100:+.1f}% "
                f"to {(max(suite['ratios']) - 1) * 100:+.1f}%); full collections "
                f"{collections['full']}",
                suite["ratio"] <= SUITE_CPU,
                "each traced test's first forward (a test traces a model once, so nothing "
                "repeats); by own time (profile, first trace): " + _top(prof, "first trace"),
            )
        )

    depths = depth(quick)

    def spread(costs: list) -> float:
        return max(costs) / min(costs) if min(costs) > 0 else float("inf")

    mine = spread([d[0] for d in depths.values()])
    floor = spread([d[2] for d in depths.values()])
    quiet = spread([d[3] for d in depths.values()])
    paired = paired_spread([d[4] for d in depths.values()])
    paired_floor = paired_spread([d[5] for d in depths.values()])
    tables.append(
        Table(
            "Per-op cost of a traced GPT forward by depth",
            [
                "layers",
                "ops",
                "extra per op",
                "recorder + weak table floor, per op",
                "extra per op, collector off",
            ],
            [[str(n), str(d[1]), _us(d[0]), _us(d[2]), _us(d[3])] for n, d in depths.items()],
            [
                "B=2, T=16; all depths and the floor in the same interleaved rounds. The "
                f"target's spread is paired: per round, each depth's per-op cost over "
                f"another's, the median over the rounds, the largest pair: {paired:.2f}x "
                f"(the floor's {paired_floor:.2f}x). The medians of the columns, largest "
                f"over smallest: {mine:.2f}x (the floor's {floor:.2f}x; with the collector "
                f"off, {quiet:.2f}x)."
            ],
        )
    )
    targets.append(
        Target(
            f"per-op cost vs depth ({', '.join(map(str, depths))} layers)",
            "flat within 10%",
            f"{paired:.2f}x paired spread (floor {paired_floor:.2f}x; medians {mine:.2f}x, "
            f"collector off {quiet:.2f}x)",
            paired <= DEPTH_FLAT,
            f"per op, by depth: {', '.join(_us(d[0]) for d in depths.values())}; with the "
            f"collector off {', '.join(_us(d[3]) for d in depths.values())}; the floor's "
            f"{', '.join(_us(d[2]) for d in depths.values())}",
        )
    )
    return Section("Cost per op against the floors, and the targets of issue 16", tables, targets)


if __name__ == "__main__":
    start = time.perf_counter()
    section = run(quick="--quick" in sys.argv)
    print(section.markdown())
    for t in section.targets:
        print(f"{'met   ' if t.met else 'MISSED'}  {t.what}: {t.measured} (target {t.target})")
    print(f"{time.perf_counter() - start:.0f} s")
