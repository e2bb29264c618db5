"""A shape annotation in the model's file that cannot be a contract: a mistake in the file,
like a syntax error (exit status 2), not the model crashing (1).

Two kinds reach the CLI: shapeguard's own `MalformedContract` (an axis string that does not
parse, a symbolic dim nothing binds), and jaxtyping refusing the subscript itself
(`Float[Tensor, "batch seq,d_model"]`) while the file is imported.
"""

import os
import traceback

from .. import _source
from .._errors import MalformedContract, first_line
from .loader import LoadError

# jaxtyping builds `Float[Tensor, "..."]` here; an error raised from it is the subscript's.
_JAXTYPING_SUBSCRIPT = (os.path.join("jaxtyping", "_array_types.py"), "__getitem__")


def malformed_contract(error: BaseException) -> LoadError | None:
    """The usage error naming `error` as a malformed contract, with its file and line;
    None when `error` is something else."""
    if isinstance(error, MalformedContract):
        return _named(error.location, str(error))
    where = _jaxtyping_subscript_site(error)
    if where is None:
        return None
    return _named(where, f"jaxtyping cannot read it: {first_line(error) or type(error).__name__}")


def _named(location: str, text: str) -> LoadError:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    at = f" at {location}" if location else ""
    return LoadError(f"malformed contract{at}: {' '.join(lines)}")


def _jaxtyping_subscript_site(error: BaseException) -> str | None:
    """`file:line` of the subscript jaxtyping raised `error` from, or None when it did not."""
    frames = traceback.extract_tb(error.__traceback__)
    for caller, frame in zip(frames, frames[1:], strict=False):
        if (
            frame.filename.endswith(_JAXTYPING_SUBSCRIPT[0])
            and frame.name == _JAXTYPING_SUBSCRIPT[1]
        ):
            return f"{_source.display_path(caller.filename)}:{caller.lineno}"
    return None
