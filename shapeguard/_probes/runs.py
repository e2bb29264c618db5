"""How the probes run a module: like with like, and a refusal told from a crash.

- Every forward of a probe starts from the same RNG state (`Pin`, a forward pre-hook on
  the private copy), so a module that draws from the global RNG (random masking, noise)
  draws the same numbers in the reference run and the edited one: where the shapes are
  the same, the two runs compare like with like.
- A module that raises on an input a probe made (`Rejected`) has not shown a
  counterexample: the probe is inconclusive, with the module's own error. A probe's own
  crash (shapeguard's code) is inconclusive too, and says where it happened
  (`describe_crash`).
"""

import traceback

import torch

from .. import _errors


class Rejected(Exception):
    """The module raised on an input a probe made: no counterexample, no verdict."""

    def __init__(self, error: BaseException, what: str = "", inputs=None) -> None:
        super().__init__(str(error))
        self.error = error
        self.what = what  # what the probe did, "running the first 2 of 4 examples alone"
        self.inputs = inputs  # (args, kwargs) the module raised on, to locate the op


def first_line(error: BaseException) -> str:
    """The error's first line, or its type's name when it says nothing."""
    return _errors.first_line(error) or type(error).__name__


def call(model, inputs, what: str = ""):
    """`model(*args, **kwargs)`; an error of the module's is raised as `Rejected`."""
    args, kwargs = inputs
    try:
        return model(*args, **kwargs)
    except Exception as error:
        raise Rejected(error, what, inputs) from error


def describe_crash(error: BaseException) -> str:
    """`IndexError: index -9 is out of bounds ... (at shapeguard/_probes/masks.py:101)`:
    an error of shapeguard's own code, with the last of its frames."""
    where = ""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        path = frame.filename.replace("\\", "/")
        if "/shapeguard/" in path:
            where = f" (at shapeguard/{path.rsplit('/shapeguard/', 1)[1]}:{frame.lineno})"
            break
    return f"{type(error).__name__}: {first_line(error)}{where}"


# -- the same RNG state for every forward -----------------------------------------------------
class Pin:
    """A forward pre-hook that sets the RNG state `seed` makes before each forward of the
    module it is on (the CPU generator, and every CUDA device's once CUDA is in use).
    The caller's own states are restored when `check` ends (`untouched.untouched`)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.handle = None  # the hook's handle on the module it was put on

    def __deepcopy__(self, memo) -> "Pin":
        return self  # a copy of the module (float64, head-permuted) shares its pin

    def __call__(self, module, args) -> None:
        torch.random.default_generator.manual_seed(self.seed)  # the CPU generator only
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.manual_seed_all(self.seed)


def pin(model, seed: int) -> Pin:
    """Pin the RNG state of every forward of `model` (a private copy) to `seed`'s."""
    hook = Pin(seed)
    hook.handle = model.register_forward_pre_hook(hook)
    return hook
