"""One reader of the sizes a module declares: the engine and a contract agree, also when
a size is a property (`@property def head_dim`) rather than a plain attribute."""

import pytest
from jaxtyping import Float
from torch import Tensor, nn

from shapeguard._contract.bindings import bind_attributes
from shapeguard._contract.compile import compile_contract
from shapeguard._names import axes as _axes

pytestmark = pytest.mark.no_shapeguard


class PropertyHeadDim(nn.Module):
    """head_dim 16 by property, although d_model // n_heads would be 12."""

    def __init__(self):
        super().__init__()
        self.d_model, self.n_heads = 48, 4

    @property
    def head_dim(self) -> int:
        return 16


class BrokenProperty(nn.Module):
    def __init__(self):
        super().__init__()
        self.d_model, self.n_heads = 48, 4

    @property
    def head_dim(self) -> int:
        raise RuntimeError("not configured yet")


def test_a_property_declares_its_value():
    assert _axes.declared_sizes(PropertyHeadDim())["d_k"] == ("head_dim", 16)


def test_a_property_that_cannot_answer_declares_nothing_and_the_size_is_derived():
    declared = _axes.declared_sizes(BrokenProperty())
    assert declared["d_k"][1] == 12


def test_the_engine_and_a_contract_read_the_same_size():
    module = PropertyHeadDim()
    declared = _axes.declared_sizes(module)

    def forward(self, x: Float[Tensor, "batch seq heads d_k"]): ...

    contract = compile_contract(forward, method=True)
    bindings = bind_attributes(contract, module)
    assert bindings.sizes["d_k"] == declared["d_k"][1] == 16
    assert bindings.sources["d_k"] == "self.head_dim"


class _Sizes(type):
    """A metaclass whose own attribute a class lookup finds (`Meta.n_heads`)."""

    n_heads = 6


class _Base(nn.Module):
    head_dim = 8  # a class attribute, inherited


def test_every_place_a_name_can_live_is_read():
    # The instance dict, a base class, a config, and a metaclass's own attribute: each
    # read as a plain getattr would (the reader skips only names held nowhere).
    module = _Base()
    module.d_model = 48
    assert _axes.declared_sizes(module) == {"d_model": ("d_model", 48), "d_k": ("head_dim", 8)}
    module.config = type("Config", (), {"num_attention_heads": 3})()
    assert _axes.declared_sizes(module)["heads"] == ("num_attention_heads", 3)

    class WithMeta(metaclass=_Sizes):
        pass

    assert _axes.declared_sizes(WithMeta()) == {"heads": ("n_heads", 6)}


def test_a_size_set_after_a_first_read_is_read_the_next_time():
    module = _Base()
    assert "d_model" not in _axes.declared_sizes(module)
    module.d_model = 48
    _Base.n_heads = 4  # on the class, after a first read
    try:
        assert _axes.declared_sizes(module)["heads"] == ("n_heads", 4)
        assert _axes.declared_sizes(module)["d_model"] == ("d_model", 48)
    finally:
        del _Base.n_heads
    assert "heads" not in _axes.declared_sizes(module)
