"""The forward's signature, read for the inputs shapeguard makes: which parameters take a
tensor, which are flags, and how values are put in as positional and keyword arguments.

A parameter whose default is a bool, a number or a string (DINOv2's
`forward(*args, is_training=False)`) is a flag: nothing is made up for it. A forward that
takes `*args` gets positional inputs from `--input ARGS=SIZES`, named after its `*args`
parameter and repeated for each positional input in order.
"""

import inspect

from .loader import LoadError

# What a flag's default is: a tensor input's default is None or absent.
_FLAG_TYPES = (bool, int, float, str, bytes)


def forward_signature(model) -> inspect.Signature:
    try:
        return inspect.signature(model.forward)
    except (TypeError, ValueError):
        return inspect.Signature()


def named_params(signature: inspect.Signature) -> dict[str, inspect.Parameter]:
    """The parameters that take one named value (not `*args`, not `**kwargs`)."""
    return {
        name: p
        for name, p in signature.parameters.items()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def var_positional(signature: inspect.Signature) -> str | None:
    """The name of the forward's `*args` parameter, or None."""
    return next((p.name for p in signature.parameters.values() if p.kind is p.VAR_POSITIONAL), None)


def takes_var_keyword(signature: inspect.Signature) -> bool:
    return any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())


def is_flag(param: inspect.Parameter) -> bool:
    """A parameter with a bool, number or string default: a setting, never a tensor."""
    return param.default is not param.empty and isinstance(param.default, _FLAG_TYPES)


def signature_text(signature: inspect.Signature) -> str:
    parts = []
    for p in signature.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
        elif p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        else:
            parts.append(p.name if p.default is p.empty else f"{p.name}=...")
    return "(" + ", ".join(parts) + ")"


def positional_key(name: str, index: int) -> str:
    """The key of the `index`-th value of `*name` among the inputs: `args[0]`."""
    return f"{name}[{index}]"


def split(signature: inspect.Signature, values: dict) -> tuple[tuple, dict]:
    """Positional arguments while the parameters come in order, keywords after; the values
    of `*args` (keys `args[0]`, `args[1]`, ...) after the positional ones."""
    params = named_params(signature)
    star = var_positional(signature)
    extra = []
    if star is not None:
        index = 0
        while positional_key(star, index) in values:
            extra.append(values[positional_key(star, index)])
            index += 1
    args: list = []
    kwargs: dict = {}
    positional = True
    for name, param in params.items():
        before_star = param.kind is not param.KEYWORD_ONLY
        if name not in values:
            if extra and before_star and param.default is not param.empty:
                args.append(param.default)  # `*args` comes after it: it must be filled
                continue
            if param.kind is not param.POSITIONAL_ONLY:
                positional = False
            continue
        if (positional or extra) and before_star:
            args.append(values[name])
        else:
            kwargs[name] = values[name]
    args.extend(extra)
    taken = set(params) | {positional_key(star or "", i) for i in range(len(extra))}
    for name, value in values.items():  # names only **kwargs takes
        if name not in taken:
            kwargs[name] = value
    return tuple(args), kwargs


def keyed_specs(specs: dict, signature, owner: str) -> dict:
    """`specs` keyed by the parameter each goes to: a `forward(*args)`'s positional inputs
    as `args[0]`, `args[1]`, ...; a LoadError for a name the forward does not take."""
    params = named_params(signature)
    star = var_positional(signature)
    keyed = {}
    for key, spec in specs.items():
        if spec.name in params and key == spec.name:
            keyed[key] = spec
        elif spec.name == star:
            index = sum(s.name == star for s in keyed.values())
            keyed[positional_key(spec.name, index)] = spec
        elif spec.name in params:
            raise LoadError(
                f"--input {spec.name} is given twice; give it once (only a forward's *args "
                "takes a name again, for its next positional input)"
            )
        elif takes_var_keyword(signature):
            keyed[key] = spec
        else:
            raise LoadError(
                f"--input {spec.name}: {owner}.forward{signature_text(signature)} has no "
                f"parameter {spec.name!r}; name one of: {choices(signature)}"
            )
    return keyed


def choices(signature) -> str:
    names = [n for n, p in named_params(signature).items() if not is_flag(p)]
    star = var_positional(signature)
    if star is not None:
        names.append(f"{star} (its positional inputs, in order: repeat --input {star}=SIZES)")
    return ", ".join(names) or "none"


def spelling(signature) -> str:
    star = var_positional(signature)
    if star is None:
        return "NAME=SIZES"
    named = [n for n, p in named_params(signature).items() if not is_flag(p)]
    others = " or NAME=SIZES" if named or takes_var_keyword(signature) else ""
    return f"{star}=SIZES (repeated for each positional input, in order){others}"
