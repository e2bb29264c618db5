"""Worker subprocesses: each architecture runs in one, under a timeout.

A worker serves up to `PER_WORKER` subjects and is then replaced (transformers' module
caches grow). A subject that runs past its timeout, or whose worker dies (a segfault, an
out-of-memory kill), is recorded as such and a fresh worker takes the next subject: a hang
never stops the sweep. Each new worker first traces a known bug (softmax over the query
axis) and refuses to run anything if shapeguard misses it: a sweep with the checks switched
off would report a clean world.
"""

import contextlib
import multiprocessing as mp
import os
import threading
import time

PER_WORKER = 12


def _sentinel_finds_the_bug() -> bool:
    import warnings

    import torch
    from torch import nn

    import shapeguard

    class SoftmaxOverQueries(nn.Module):
        def __init__(self, d_model=32, heads=4):
            super().__init__()
            self.heads, self.d_k = heads, d_model // heads
            self.q, self.k, self.v = (nn.Linear(d_model, d_model) for _ in range(3))

        def forward(self, x):
            b, s, _ = x.shape
            split = lambda t: t.view(b, s, self.heads, self.d_k).transpose(1, 2)  # noqa: E731
            q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
            scores = q @ k.transpose(-2, -1) / self.d_k**0.5
            return (scores.softmax(dim=-2) @ v).transpose(1, 2).reshape(b, s, -1)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with shapeguard.trace(mode="warn") as trace:
            SoftmaxOverQueries()(torch.randn(3, 7, 32))
    return any(f.kind == "softmax_axis" for f in trace.findings)


def _serve(conn, log_path):
    """The worker's loop: receive a subject, send its result; None ends it."""
    if log_path:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch

    torch.set_num_threads(1)
    if not _sentinel_finds_the_bug():
        conn.send({"fatal": "shapeguard missed the known bug (softmax over the queries)"})
        return
    from _world_subjects import run_subject

    while True:
        task = conn.recv()
        if task is None:
            return
        try:
            result = run_subject(*task)
        except Exception as error:  # the runner's own failure: recorded, the sweep goes on
            result = {
                "name": task[1],
                "source": task[0],
                "status": "runner error",
                "error": repr(error)[:300],
            }
        conn.send(result)


class Worker:
    def __init__(self, log_path):
        context = mp.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, log_path), daemon=True)
        self.process.start()
        self.served = 0

    def run(self, task, timeout):
        """The subject's result, or a record of its timeout or its worker's death."""
        self.conn.send(task)
        self.served += 1
        start = time.perf_counter()
        try:
            if self.conn.poll(timeout):
                return self.conn.recv(), True
            status, error = "timeout", f"no result after {timeout} s"
        except (EOFError, OSError):
            status, error = "died", "the worker died"
        self.kill()
        code = self.process.exitcode
        if status == "died":
            error += f" (exit code {code})"
        return {"name": task[1], "source": task[0], "status": status, "error": error,
                "seconds": round(time.perf_counter() - start, 1)}, False  # fmt: skip

    def kill(self):
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)

    def close(self):
        with contextlib.suppress(OSError, BrokenPipeError):
            self.conn.send(None)
        self.process.join(10)
        self.kill()


def run_all(tasks, *, jobs=1, timeout=240, log_path=None, on_result=None):
    """Results of every task, in the order of `tasks`; `jobs` workers side by side."""
    results = [None] * len(tasks)
    queue = list(enumerate(tasks))
    lock = threading.Lock()
    fatal = []

    def loop():
        worker = None
        while True:
            with lock:
                if not queue or fatal:
                    break
                index, task = queue.pop(0)
            if worker is None:
                worker = Worker(log_path)
            result, alive = worker.run(task, timeout)
            if "fatal" in result:
                fatal.append(result["fatal"])
                break
            results[index] = result
            if on_result is not None:
                with lock:
                    on_result(result)
            if not alive or worker.served >= PER_WORKER:
                worker.close() if alive else None
                worker = None
        if worker is not None:
            worker.close()

    threads = [threading.Thread(target=loop) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if fatal:
        raise SystemExit(f"world: {fatal[0]}")
    return [r for r in results if r is not None]
