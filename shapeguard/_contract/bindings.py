"""Contract dims bound to a module's attributes: `heads` to `self.n_heads`, and so on."""

from dataclasses import dataclass, field

from .._errors import MalformedContract
from .._names import axes as _axes
from .compile import Contract

_ALIAS_AXIS = {
    alias: axis for axis, aliases in _axes.ATTRIBUTE_AXES.items() for alias in (axis, *aliases)
}


@dataclass(slots=True)
class Bindings:
    """Dims a module fixes by its attributes: sizes for the memo, sources for messages."""

    sizes: dict[str, int] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)


def _int_attribute(obj, name: str) -> int | None:
    value = getattr(obj, name, None)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def bind_attributes(contract: Contract, module) -> Bindings:
    """Bind the contract's dims named like a module attribute to that attribute's value.

    `d_model` binds to `self.d_model`; a canonical axis name binds through its usual
    spellings (`heads` to `self.n_heads`, `d_k` to `self.head_dim` or d_model // heads).
    Raises MalformedContract when a symbolic dim names a size nothing binds.
    """
    bindings = Bindings()
    wanted = contract.dim_names | contract.symbolic_names
    declared = None
    config = getattr(module, "config", None)
    for name in sorted(wanted):
        value = _int_attribute(module, name)
        if value is not None:
            bindings.sizes[name], bindings.sources[name] = value, f"self.{name}"
            continue
        value = _int_attribute(config, name) if config is not None else None
        if value is not None:
            bindings.sizes[name], bindings.sources[name] = value, f"self.config.{name}"
            continue
        axis = _ALIAS_AXIS.get(name)
        if axis is None:
            continue
        if declared is None:
            declared = _axes.declared_sizes(module)
        if axis in declared:
            attr, value = declared[axis]
            if " " in attr:  # derived: d_model // heads
                attr = " // ".join(f"self.{declared[a][0]}" for a in ("d_model", "heads"))
                source = attr
            elif _int_attribute(module, attr) is not None:
                source = f"self.{attr}"
            else:
                source = f"self.config.{attr}"
            bindings.sizes[name], bindings.sources[name] = value, source
    missing = contract.unbound_names - set(bindings.sizes)
    if missing:
        names = ", ".join(sorted(missing))
        raise MalformedContract(
            f"{contract.qualname}: a symbolic dim uses {names}, which no argument and no "
            f"attribute of {type(module).__name__} binds; name it in an argument's annotation "
            f"or set self.{sorted(missing)[0]}",
            contract.declared_at("def"),
        )
    return bindings
