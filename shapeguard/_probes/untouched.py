"""Leaving the caller's module as it was while `check` runs: a private copy in eval
mode, with RNG states, train/eval modes and requires_grad flags restored afterwards."""

import copy
import random
from contextlib import contextmanager


@contextmanager
def untouched(model):
    """A private copy of `model` in eval mode; RNG states, modes and requires_grad
    restored afterwards. Without a copy (deepcopy failed), the module itself,
    with its parameters and buffers restored too. The caller's module is in eval mode
    while the check runs as well: a copy can still call its modules through a closure
    (minGPT's `mlpf` lambda calls the original's Dropout), and the probes test eval mode."""
    import torch

    rng = torch.get_rng_state()
    cuda = (
        torch.cuda.get_rng_state_all()
        if torch.cuda.is_available() and torch.cuda.is_initialized()
        else None
    )
    py_rng = random.getstate()
    modes = {m: m.training for m in model.modules()}
    grads = {p: p.requires_grad for p in model.parameters()}
    saved = None
    try:
        work = copy.deepcopy(model)
    except Exception:
        work = model
        saved = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
    try:
        model.eval()
        work.eval()
        yield work
    finally:
        torch.set_rng_state(rng)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(py_rng)
        if saved is not None:
            with torch.no_grad():
                for key, value in model.state_dict(keep_vars=True).items():
                    if value.shape == saved[key].shape:
                        value.copy_(saved[key])
        for module, training in modes.items():
            module.training = training
        for param, flag in grads.items():
            param.requires_grad_(flag)
