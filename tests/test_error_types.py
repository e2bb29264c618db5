"""Errors about bad arguments are the built-in type a Python user catches: a `ContractError`
is a `ValueError`, and one about an argument of the wrong type is a `TypeError` too. Each
stays a `ContractError` (so `except shapeguard.ContractError` keeps working) with the
message it always had; a malformed contract also says where it was declared."""

import inspect
import pickle

import pytest
import torch
from jaxtyping import Float
from torch import Tensor, nn

import shapeguard
from shapeguard import ContractError
from shapeguard._errors import ContractTypeError, MalformedContract
from shapeguard.attention import flash_attention

# (call, message): a wrong value, a ValueError and not a TypeError.
WRONG_VALUES = [
    (
        lambda: shapeguard.guard(mode="loud"),
        "mode='loud' is not a shapeguard mode; use one of ('raise', 'warn')",
    ),
    (
        lambda: shapeguard.trace(mode="loud"),
        "mode='loud' is not a shapeguard mode; use one of ('raise', 'warn')",
    ),
    (
        lambda: shapeguard.contract(mode="loud"),
        "mode='loud' is not a shapeguard mode; use one of ('raise', 'warn')",
    ),
    (
        lambda: shapeguard.trace(max_events=-1),
        "max_events=-1 must be a whole number of events, 0 or more",
    ),
    (
        lambda: shapeguard.guard(nn.Linear(3, 4), check="always"),
        "check='always' is not supported; use 'every' or 'first'",
    ),
    (
        lambda: shapeguard.contract(check="sometimes"),
        "check='sometimes' is not supported; use 'every' or 'first'",
    ),
    (
        lambda: flash_attention(*_qkv(), layout="bsd"),
        "layout='bsd' is not supported; use one of ('bshd', 'bhsd')",
    ),
    (
        lambda: flash_attention(*_qkv(), backend="xformers"),
        "backend='xformers' is not supported; use one of ('auto', 'flash', 'sdpa')",
    ),
    (
        lambda: flash_attention(*_qkv(), window_size=(-2, 0)),
        "window_size=(-2, 0) is not a (left, right) pair of ints >= -1; "
        "-1 leaves that side unbounded, (-1, -1) is full attention",
    ),
]

# (call, message): an argument of the wrong type, a TypeError (and still a ValueError).
WRONG_TYPES = [
    (
        lambda: shapeguard.guard(mode=1),
        "mode=1 is not a shapeguard mode; use one of ('raise', 'warn')",
    ),
    (
        lambda: shapeguard.guard(nn.Linear(3, 4), strict="yes"),
        "strict='yes' must be True or False",
    ),
    (lambda: shapeguard.trace(strict=1), "strict=1 must be True or False"),
    (
        lambda: shapeguard.trace(max_events=1.5),
        "max_events=1.5 must be a whole number of events, 0 or more",
    ),
    (
        lambda: shapeguard.trace(max_events=True),
        "max_events=True must be a whole number of events, 0 or more",
    ),
    (
        lambda: shapeguard.guard(nn.Linear(3, 4), check=None),
        "check=None is not supported; use 'every' or 'first'",
    ),
    (lambda: shapeguard.guard(3), "shapeguard.guard takes an nn.Module class or instance, not int"),
    (
        lambda: shapeguard.guard(str),
        "@shapeguard.guard decorates nn.Module subclasses; str is not one",
    ),
    (lambda: shapeguard.contract(3), "shapeguard.contract decorates functions, not int"),
    (
        lambda: shapeguard.trace(None, torch.zeros(2)),
        "shapeguard.trace() takes inputs only together with a model",
    ),
    (
        lambda: shapeguard.check(len, torch.zeros(2)),
        "shapeguard.check takes an nn.Module, not builtin_function_or_method",
    ),
    (
        lambda: flash_attention(*_qkv()[:2], [1, 2], backend="sdpa"),
        "flash_attention: v is a list, not a tensor",
    ),
    (
        lambda: flash_attention(*_qkv(), window_size="left"),
        "window_size='left' is not a (left, right) pair of ints >= -1; "
        "-1 leaves that side unbounded, (-1, -1) is full attention",
    ),
    (
        lambda: flash_attention(*_qkv(), layout=0),
        "layout=0 is not supported; use one of ('bshd', 'bhsd')",
    ),
]


def _qkv():
    return tuple(torch.zeros(2, 5, 3, 4) for _ in range(3))


@pytest.mark.parametrize(("call", "message"), WRONG_VALUES)
def test_a_wrong_value_is_a_value_error_with_its_message(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert isinstance(info.value, ContractError)
    assert not isinstance(info.value, TypeError)
    assert str(info.value) == message


@pytest.mark.parametrize(("call", "message"), WRONG_TYPES)
def test_a_wrong_type_is_a_type_error_with_its_message(call, message):
    with pytest.raises(TypeError) as info:
        call()
    assert isinstance(info.value, ContractTypeError)
    assert isinstance(info.value, ContractError)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == message


def test_existing_handlers_still_catch_them():
    try:
        shapeguard.guard(mode="loud")
    except shapeguard.ContractError as error:
        caught = error
    assert type(caught).__name__ == "ContractError"
    assert (
        repr(caught)
        == "ContractError(\"mode='loud' is not a shapeguard mode; use one of ('raise', 'warn')\")"
    )
    assert type(caught).__module__ == "shapeguard"


def test_strict_still_takes_a_bool():
    linear = shapeguard.guard(nn.Linear(3, 4), strict=True)
    assert linear(torch.zeros(2, 3)).shape == (2, 4)
    with shapeguard.trace(strict=False) as t:
        linear(torch.zeros(2, 3))
    assert t.strict is False


def test_fake_tp_counts():
    from shapeguard.distributed import fake_tp

    with pytest.raises(ValueError, match=r"^fake_tp\(tp=0\): tp must be a positive int$"):
        fake_tp(0).__enter__()
    with pytest.raises(TypeError, match=r"^fake_tp\(tp='2'\): tp must be a positive int$"):
        fake_tp("2").__enter__()
    with pytest.raises(ValueError, match=r"^fake_tp\(tp=2, rank=2\): rank must be in 0\.\.1$"):
        fake_tp(2, rank=2).__enter__()


# -- a malformed contract: a ValueError that says where it was declared ----------------------


def _line_of(fn, text: str) -> int:
    source, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(source) if text in line)


def test_a_malformed_annotation_names_its_line():
    class Broken(nn.Module):
        def forward(
            self,
            x: Float[Tensor, "batch seq+ d"],
        ):
            return x

    with pytest.raises(ValueError) as info:
        shapeguard.guard(Broken)
    error = info.value
    assert isinstance(error, MalformedContract)
    assert isinstance(error, ContractError)
    assert not isinstance(error, TypeError)
    assert str(error).endswith(
        'Broken.forward: x: dim "seq+" in "batch seq+ d" is neither a name, a number nor an '
        "expression; separate axes with spaces"
    )
    line = _line_of(Broken.forward, 'x: Float[Tensor, "batch seq+ d"]')
    assert error.location.endswith(f"test_error_types.py:{line}"), error.location


def test_a_contract_with_no_annotation_names_its_function():
    def plain(x):
        return x

    with pytest.raises(MalformedContract) as info:
        shapeguard.contract(plain)
    assert str(info.value) == (
        "test_a_contract_with_no_annotation_names_its_function.<locals>.plain has no shape "
        "annotations to check; annotate its arguments with jaxtyping, e.g. "
        'q: Float[Tensor, "batch heads seq d_k"]'
    )
    assert info.value.location.endswith(f"test_error_types.py:{_line_of(plain, 'def plain')}")


def test_a_malformed_contract_survives_pickling():
    error = MalformedContract("f: a symbolic dim uses n", "model.py:7")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is MalformedContract
    assert (str(copy), copy.location) == ("f: a symbolic dim uses n", "model.py:7")
