"""Tensor parallelism for `shapeguard trace`: the plan applied on real ranks (torchrun) and
on simulated ones (`--tp N`, `--tp 1,2,4,8`).

The plan is the file's `parallelize(model, mesh)`, else its `tp_plan` dict (module path
to a `ColwiseParallel()`/`RowwiseParallel()` or the strings "colwise"/"rowwise"), else,
for `--tp` only, a default: each module's q/k/v projections colwise, its output
projection rowwise (named as `_tp.role_of` knows them).

`--tp N` runs one subprocess per rank whose shards differ in size (rank 0, and on an
uneven split the ranks torch.chunk gives fewer features), each on torch's fake process
group of world size N, and merges their JSON reports (`_merge`). A rank's subprocess is
told which rank it plays by `SHAPEGUARD_FAKE_TP=N:r`.
"""

import contextlib
import json
import os
import subprocess
import sys
import tempfile

from .loader import LoadError

ENV = "SHAPEGUARD_FAKE_TP"


def fake_rank() -> tuple[int, int] | None:
    """(tp, rank) this process simulates, from SHAPEGUARD_FAKE_TP, else None."""
    text = os.environ.get(ENV, "")
    tp, _, rank = text.partition(":")
    if tp.isdigit() and rank.isdigit() and int(rank) < int(tp):
        return int(tp), int(rank)
    return None


def parse_degrees(text: str) -> list[int]:
    try:
        degrees = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        degrees = []
    if not degrees or any(d < 1 for d in degrees):
        raise LoadError(f"--tp {text}: give a tp degree or a list of them, e.g. --tp 2 or 1,2,4,8")
    return sorted(set(degrees))


def _has_plan(module) -> bool:
    return callable(getattr(module, "parallelize", None)) or isinstance(
        getattr(module, "tp_plan", None), dict
    )


@contextlib.contextmanager
def parallel(module, model):
    """Yield the model, tensor-parallel when this process is a rank: a simulated one
    (SHAPEGUARD_FAKE_TP) or one of torchrun's when the file has a plan. The process group
    shapeguard initialized is destroyed on exit."""
    simulated = fake_rank()
    world = os.environ.get("WORLD_SIZE", "")
    real = simulated is None and world.isdigit() and int(world) > 1 and _has_plan(module)
    if simulated is None and not real:
        yield model
        return
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    owned = False
    if simulated is not None:
        from ..distributed import register_fake_backend

        if dist.is_initialized():
            raise LoadError("--tp: the file initializes a process group itself; remove --tp")
        register_fake_backend()
        tp, rank = simulated
        dist.init_process_group("fake", store=dist.HashStore(), rank=rank, world_size=tp)
        owned = True
    elif not dist.is_initialized():
        dist.init_process_group("gloo")
        owned = True
    try:
        if _already_parallel(model):
            yield model
            return
        mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
        yield _apply(module, model, mesh)
    finally:
        if owned and dist.is_initialized():
            dist.destroy_process_group()


def _already_parallel(model) -> bool:
    from .. import _tp

    _tp.dtensor_class()
    return any(_tp.is_dtensor(p) for p in model.parameters())


def _apply(module, model, mesh):
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    hook = getattr(module, "parallelize", None)
    if callable(hook):
        out = hook(model, mesh)
        return out if out is not None else model
    plan = getattr(module, "tp_plan", None)
    if isinstance(plan, dict):
        styles: dict[str, type] = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
        resolved = {}
        for path, style in plan.items():
            if isinstance(style, str):
                if style.lower() not in styles:
                    raise LoadError(
                        f"tp_plan[{path!r}] = {style!r}: use 'colwise', 'rowwise' or a "
                        "ParallelStyle such as ColwiseParallel()"
                    )
                style = styles[style.lower()]()
            resolved[path] = style
        return parallelize_module(model, mesh, resolved)
    plan = default_plan(model)
    if not plan:
        raise LoadError(
            "--tp: found no attention projections (q/k/v and an output projection) for the "
            "default plan; define parallelize(model, mesh) or a tp_plan dict in the file"
        )
    return parallelize_module(model, mesh, {p: styles() for p, styles in plan.items()})


def default_plan(model) -> dict:
    """{path: ColwiseParallel or RowwiseParallel} for each module with q, k and v
    projections (nn.Linear children named as `_tp.role_of` knows) and an output one."""
    import torch
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from .. import _tp

    plan: dict[str, type] = {}
    for path, sub in model.named_modules():
        roles = {}
        for name, child in sub.named_children():
            role = _tp.role_of(name)
            if role and isinstance(child, torch.nn.Linear) and role not in roles:
                roles[role] = name
        if {"q", "k", "v", "o"} <= set(roles):
            prefix = f"{path}." if path else ""
            for role in ("q", "k", "v"):
                plan[prefix + roles[role]] = ColwiseParallel
            plan[prefix + roles["o"]] = RowwiseParallel
    return plan


# -- simulating ranks in subprocesses -----------------------------------------------------------
def _run_rank(argv: list[str], tp: int, rank: int, folder: str) -> tuple[dict | None, str]:
    path = os.path.join(folder, f"tp{tp}.rank{rank}.json")
    env = {**os.environ, ENV: f"{tp}:{rank}"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "shapeguard", "trace", *argv, "--json", path],
            capture_output=True,
            text=True,
            env=env,
            timeout=float(os.environ.get("SHAPEGUARD_TP_TIMEOUT", "300")),
        )
    except subprocess.TimeoutExpired:
        return None, f"rank {rank} of tp={tp} did not finish in time"
    if done.returncode not in (0, 1) or not os.path.exists(path):
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return None, "; ".join(tail) or f"exit status {done.returncode}"
    with open(path, encoding="utf-8") as f:
        return json.load(f), ""


def distinct_ranks(report: dict, tp: int) -> dict[int, list[int]]:
    """{rank to run: the ranks whose shards have its sizes}, from rank 0's report: the
    sharded projections' widths, chunked as torch.chunk does."""
    from .._tp import chunk_sizes

    modules = ((report.get("distributed") or {}).get("modules") or {}).values()
    widths = []
    for m in modules:
        for p in (m.get("projections") or {}).values():
            out, inp = p.get("global", [0, 0])
            widths.append(out if p.get("style") == "column" else inp)
    signature: dict[tuple, list[int]] = {}
    for r in range(tp):
        key = tuple(chunk_sizes(w, tp)[r] for w in widths)
        signature.setdefault(key, []).append(r)
    return {ranks[0]: ranks[1:] for ranks in signature.values()}


def simulate(argv: list[str], degrees: list[int]):
    """Run the simulated ranks of each degree: [(tp, merged or None, failure text)]."""
    from .. import _merge

    results: list[tuple[int, _merge.Merged | None, str]] = []
    with tempfile.TemporaryDirectory(prefix="shapeguard-tp-") as folder:
        for tp in degrees:
            first, failure = _run_rank(argv, tp, 0, folder)
            if first is None:
                results.append((tp, None, failure))
                continue
            reports, also = {0: first}, {}
            for rank, others in distinct_ranks(first, tp).items():
                if rank == 0:
                    also[0] = others
                    continue
                found, failure = _run_rank(argv, tp, rank, folder)
                if found is None:
                    break
                reports[rank], also[rank] = found, others
            if failure:
                results.append((tp, None, failure))
                continue
            results.append((tp, _merge.merge(reports, also), ""))
    return results
