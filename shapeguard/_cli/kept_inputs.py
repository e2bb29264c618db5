"""`shapeguard run --keep-inputs DIR` and `shapeguard check FILE --from-run DIR`: the inputs
a run's modules really got, kept on disk for a later `check`.

DIR holds `index.json` and one `inputs-N.pt` per module whose inputs could be kept:

- `index.json`: `{"schema": "shapeguard.inputs", "schema_version": 1, "shapeguard_version",
  "torch_version", "program", "module_program", "argv", "cwd", "modules": [...]}`; per
  module `{"module": class name, "class": "module.QualName", "file": "inputs-N.pt" or
  null, "why": why nothing was kept (or null), "batch": the recorded batch size (or null),
  "examples": how many examples were kept (or null: the whole call), "inputs": [{"name",
  "value"}] (each argument in words), "skipped": [{"name", "type"}]}`.
- `inputs-N.pt`: `torch.save({"args": [...], "kwargs": {...}})` of plain data only:
  CPU tensors (detached copies), None, bool, int, float, str, torch dtypes and devices,
  and lists, tuples and str-keyed dicts of those. Any other object (a dataclass, a
  namedtuple, a tensor subclass) is never pickled: it is skipped and named in `skipped`,
  and `check --from-run` refuses that module's inputs, since its call cannot be rebuilt.
  The file is read back with `torch.load(weights_only=True)`, which unpickles nothing
  else either.

The index is written last, so a run stopped while writing leaves no index, not a wrong one.
"""

import json
import os
from dataclasses import dataclass

from .errors import UsageFailure
from .kept_sample import first_examples
from .run_check import MAX_BYTES

SCHEMA = "shapeguard.inputs"
SCHEMA_VERSION = 1
INDEX = "index.json"
_MAKE = "make them with: shapeguard run --keep-inputs DIR script.py"


def prepare_dir(folder: str) -> None:
    """Make DIR before the program runs (a usage error once the program ran would lose the
    run): a missing folder is made, an empty one or an earlier `--keep-inputs` folder is
    used (its indexed files replaced), any other folder is refused."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UsageFailure(f"--keep-inputs {folder}: not a folder")
    if os.path.isdir(folder) and os.listdir(folder) and not os.path.isfile(_index(folder)):
        raise UsageFailure(
            f"--keep-inputs {folder}: the folder holds other files; give a new or empty folder"
        )
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        raise UsageFailure(f"--keep-inputs {folder}: cannot make it: {error.strerror}") from None
    if not os.access(folder, os.W_OK):
        raise UsageFailure(f"--keep-inputs {folder}: not writable")


def save(folder: str, watched: list, program: dict) -> list[str]:
    """Write each watched module's kept inputs (`Watched.sample`) and the index into
    `folder`; return one note per module whose inputs were not kept, or kept in part."""
    import torch

    from .._version import __version__

    _remove_earlier(folder)
    modules, notes = [], []
    for number, item in enumerate(watched, 1):
        entry = _entry(item)
        sample = item.sample
        if sample is None:
            entry["why"] = f"its inputs are over {MAX_BYTES >> 20} MiB: no copy was kept"
        else:
            sample, entry["batch"], entry["examples"] = first_examples(item.module, sample)
            skipped: list[dict] = []
            names = _positional_names(item.module, len(sample.args))
            args = [_plain(v, n, skipped) for n, v in zip(names, sample.args, strict=True)]
            kwargs = {k: _plain(v, k, skipped) for k, v in sample.kwargs.items()}
            entry["inputs"] = [
                {"name": n, "value": _describe(v)} for n, v in zip(names, sample.args, strict=True)
            ] + [{"name": k, "value": _describe(v)} for k, v in sample.kwargs.items()]
            entry["skipped"] = skipped
            if skipped:
                entry["why"] = "not kept: " + ", ".join(
                    f"{s['name']} (a {s['type']})" for s in skipped
                )
            else:
                entry["file"] = f"inputs-{number}.pt"
                torch.save({"args": args, "kwargs": kwargs}, os.path.join(folder, entry["file"]))
        if entry["why"]:
            notes.append(f"{entry['module']}: no inputs kept: {entry['why']}")
        modules.append(entry)
    index = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "shapeguard_version": __version__,
        "torch_version": torch.__version__,
        **program,
        "modules": modules,
    }
    with open(_index(folder), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2)
    return notes


def _entry(item) -> dict:
    cls = type(item.module) if item.module is not None else None
    return {
        "module": item.name,
        "class": f"{cls.__module__}.{cls.__qualname__}" if cls is not None else item.name,
        "file": None,
        "why": None,
        "batch": None,
        "examples": None,
        "inputs": [],
        "skipped": [],
    }


def _positional_names(module, count: int) -> list[str]:
    """The forward parameters the positional inputs go to; `args[i]` past them (`*args`)."""
    import inspect

    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError, AttributeError):
        params = []
    named = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [named[i] if i < len(named) else f"args[{i}]" for i in range(count)]


def _remove_earlier(folder: str) -> None:
    """An earlier `--keep-inputs` into the same folder: its index and the files it lists."""
    try:
        with open(_index(folder), encoding="utf-8") as f:
            earlier = json.load(f)
        files = [m.get("file") for m in earlier.get("modules", ())]
    except (OSError, ValueError, AttributeError, TypeError):
        files = []
    for name in [*files, INDEX]:
        if isinstance(name, str) and os.path.basename(name) == name:
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                os.remove(path)


def _plain(value, name: str, skipped: list):
    """`value` as plain data torch.save stores and `weights_only` loads, or None (and
    an entry in `skipped`) for anything else."""
    import torch

    if value is None or type(value) in (bool, int, float, str, torch.dtype, torch.device):
        return value
    if type(value) is torch.Tensor and value.layout == torch.strided:
        return value.cpu()
    if type(value) in (list, tuple):
        return type(value)(_plain(v, f"{name}[{i}]", skipped) for i, v in enumerate(value))
    if type(value) is dict and all(type(k) is str for k in value):
        return {k: _plain(v, f"{name}.{k}", skipped) for k, v in value.items()}
    skipped.append({"name": name, "type": type(value).__qualname__})
    return None


def _describe(value) -> str:
    from .._values import dtype_name, is_tensor

    if is_tensor(value):
        return f"[{', '.join(map(str, value.shape))}] {dtype_name(value.dtype)}"
    if type(value) in (list, tuple, dict):
        return f"{type(value).__name__} of {len(value)}"
    if value is None or type(value) in (bool, int, float):
        return repr(value)
    return f"a {type(value).__qualname__}"  # never a value that could hold data


# -- reading back ------------------------------------------------------------------------------


@dataclass(slots=True)
class Kept:
    """One module's kept call, read back: its inputs and where they came from."""

    args: tuple
    kwargs: dict
    how: str


def load(folder: str, model, name: str | None) -> Kept:
    """The kept inputs in `folder` of the module named `name` (its class name or
    module.QualName), or of `model`'s class when no name is given; a `UsageFailure` with
    one line for a missing or corrupt folder, no such module, or inputs not kept."""
    index = read_index(folder)
    wanted = name or type(model).__name__
    entries = [
        m
        for m in index["modules"]
        if isinstance(m, dict) and wanted in (m.get("module"), m.get("class"))
    ]
    if not entries:
        have = ", ".join(str(m.get("module")) for m in index["modules"] if isinstance(m, dict))
        pick = "" if name else f" ({type(model).__name__} is the model built from FILE)"
        raise UsageFailure(
            f"{folder} has no inputs for {wanted}{pick}; it has inputs for: {have or 'none'} "
            "(pick the model with --model, or the inputs with --module NAME)"
        )
    entry = entries[0]
    if not entry.get("file"):
        raise UsageFailure(
            f"{folder}: the run kept no inputs for {wanted}: {entry.get('why') or 'no reason given'}"
        )
    data = _read_tensors(folder, entry["file"])
    program = index.get("program") or index.get("module_program") or "the program"
    kept = entry.get("examples")
    part = f", {kept} of {entry.get('batch')} examples" if kept else ""
    how = f"the run of {os.path.basename(str(program))} kept in {folder}{part}"
    return Kept(tuple(data["args"]), dict(data["kwargs"]), how)


def read_index(folder: str) -> dict:
    """DIR's index, checked; a `UsageFailure` with one line where it is missing or corrupt."""
    if not os.path.isdir(folder):
        raise UsageFailure(f"--from-run {folder}: no such folder ({_MAKE})")
    try:
        with open(_index(folder), encoding="utf-8") as f:
            index = json.load(f)
    except FileNotFoundError:
        raise UsageFailure(f"--from-run {folder}: no {INDEX} in it ({_MAKE})") from None
    except (OSError, ValueError) as error:
        raise UsageFailure(f"--from-run {folder}: {INDEX} cannot be read: {error}") from None
    if not isinstance(index, dict) or index.get("schema") != SCHEMA:
        raise UsageFailure(f"--from-run {folder}: {INDEX} is not a shapeguard inputs index")
    if index.get("schema_version") != SCHEMA_VERSION or not isinstance(index.get("modules"), list):
        raise UsageFailure(
            f"--from-run {folder}: {INDEX} is schema version {index.get('schema_version')}, "
            f"this shapeguard reads version {SCHEMA_VERSION}"
        )
    return index


def _read_tensors(folder: str, name: str) -> dict:
    import pickle

    import torch

    path = os.path.join(folder, os.path.basename(str(name)))
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UsageFailure(f"--from-run {folder}: {name} is missing") from None
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageFailure(f"--from-run {folder}: {name} cannot be read: {first}") from None
    if not (
        isinstance(data, dict)
        and isinstance(data.get("args"), list | tuple)
        and isinstance(data.get("kwargs"), dict)
    ):
        raise UsageFailure(f"--from-run {folder}: {name} does not hold kept inputs")
    return data


def _index(folder: str) -> str:
    return os.path.join(folder, INDEX)
