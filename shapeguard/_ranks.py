"""Which rank of a multi-process run this is, and how its output is kept apart from the
other ranks': `[rank r/N]` at the start of each line, full reports from rank 0 only
(`SHAPEGUARD_RANKS=all` or `=0,3` to choose), `{rank}` in report paths.

Read from `torch.distributed` when it is already imported and initialized, else from
torchrun's environment (`RANK`, `WORLD_SIZE`); never a collective, so nothing here can
hang when another rank has failed. Pure Python: torch is never imported here.
"""

import os
import sys


def rank_world() -> tuple[int, int] | None:
    """(rank, world size) of a run with more than one rank, else None."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                world = int(dist.get_world_size())
                return (int(dist.get_rank()), world) if world > 1 else None
        except (RuntimeError, ValueError):
            pass
    size, rank = os.environ.get("WORLD_SIZE", ""), os.environ.get("RANK", "")
    if size.isdigit() and rank.isdigit() and int(size) > 1:
        return int(rank), int(size)
    return None


def describe(info: dict) -> dict:
    """Add this process's rank and world size (and `simulated`) to `info`, when it has them."""
    found = rank_world()
    if found is not None:
        info.setdefault("rank", found[0])
        info.setdefault("world_size", found[1])
        if simulated():
            info.setdefault("simulated", True)
    return info


def simulated() -> bool:
    """The process group is torch's `fake` one: one process plays one rank of many, with
    no other rank to tell its output from (tests, `shapeguard trace --tp`)."""
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(
            dist is not None
            and dist.is_available()
            and dist.is_initialized()
            and str(dist.get_backend()) == "fake"
        )
    except (RuntimeError, ValueError):
        return False


def prefix() -> str:
    """`[rank 1/2] ` in a run with several real ranks, else ""."""
    found = rank_world()
    if found is None or simulated():
        return ""
    return f"[rank {found[0]}/{found[1]}] "


def prefixed(text: str) -> str:
    """`text` with the rank prefix at the start of every line."""
    lead = prefix()
    if not lead:
        return text
    return "".join(lead + line for line in text.splitlines(keepends=True))


def shows_full_report() -> bool:
    """Whether this rank prints whole reports (tables); the others print their findings.
    Rank 0 by default; `SHAPEGUARD_RANKS=all`, or a list such as `0,3`."""
    found = rank_world()
    if found is None or simulated():
        return True
    chosen = os.environ.get("SHAPEGUARD_RANKS", "0").strip().lower()
    if chosen == "all":
        return True
    wanted = {int(r) for r in chosen.replace(" ", "").split(",") if r.isdigit()}
    return found[0] in (wanted or {0})


def rank_path(path: str) -> str:
    """A report path for this rank: `{rank}` filled in; in a run with several ranks, a
    path without it gets `.rank<r>` before its suffix, so ranks never write one file."""
    found = rank_world()
    rank = found[0] if found is not None else 0
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    if found is None or simulated():
        return path
    stem, dot, suffix = path.rpartition(".")
    if not dot or os.sep in suffix:
        return f"{path}.rank{rank}"
    return f"{stem}.rank{rank}.{suffix}"


def write_lines(text: str, *, err: bool = False) -> None:
    """Write `text` with the rank prefix, one whole line per write, flushed: lines of
    ranks sharing a terminal or a pipe interleave, never their characters."""
    stream = sys.stderr if err else sys.stdout
    for line in prefixed(text).splitlines(keepends=True):
        stream.write(line if line.endswith("\n") else line + "\n")
        stream.flush()
