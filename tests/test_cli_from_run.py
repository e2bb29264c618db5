"""`shapeguard run --keep-inputs DIR` then `shapeguard check FILE --from-run DIR` (issue 30):
the probes of a later command on the inputs the program really passed.

The program makes token ids with padding and its own `[B, 1, S]` mask (the tutorial
encoder's `src_mask`, which made-up inputs got wrong); the model lives in its own file,
which `check` loads. Sizes are pairwise distinct: batch 6 in the program (4 kept), heads 2,
seq 7, d_k 32, d_model 64, vocabulary 50.
"""

import hashlib
import json
import os
import sys
import textwrap

import pytest
import torch
from click.testing import CliRunner

from shapeguard._cli.commands import cli

pytestmark = pytest.mark.no_shapeguard  # the programs open their own traces

MODEL = """
import math

import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self, vocab=50, d_model=64, n_heads=2):
        super().__init__()
        self.n_heads, self.dk = n_heads, d_model // n_heads
        self.emb = nn.Embedding(vocab, d_model, padding_idx=0)
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, src, src_mask):
        x = self.emb(src)
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.n_heads, self.dk).transpose(1, 2)
        k = self.k(x).view(B, T, self.n_heads, self.dk).transpose(1, 2)
        v = self.v(x).view(B, T, self.n_heads, self.dk).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.dk)
        scores = scores.masked_fill(src_mask.unsqueeze(1) == 0, -1e9)  # [B, 1, 1, S]
        return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))


class Other(nn.Module):
    def forward(self, x):
        return x


def build_model():
    return Encoder()
"""

# Heads carved out of the sequence: legal (7 * 64 == 2 * 7 * 32), silently wrong.
BUGGY = MODEL.replace(
    "q = self.q(x).view(B, T, self.n_heads, self.dk).transpose(1, 2)",
    "q = self.q(x).view(B, self.n_heads, T, self.dk)",
)

PROGRAM = """
import torch
from attn_model import Encoder

torch.manual_seed(0)
src = torch.tensor([[3, 4, 5, 0, 0, 0, 0], [6, 7, 8, 9, 10, 1, 2], [1, 2, 0, 0, 0, 0, 0],
                    [5, 5, 5, 5, 0, 0, 0], [7, 8, 9, 1, 2, 3, 0], [9, 9, 0, 0, 0, 0, 0]])
src_mask = (src != 0).unsqueeze(-2)  # [B, 1, S]
before = src.clone()
model = Encoder()
print(tuple(model(src, src_mask=src_mask).shape), bool((src == before).all()))
"""

# A config object handed to forward: not plain data, so never pickled.
WITH_CONFIG = """
from dataclasses import dataclass

import torch
from attn_model import Encoder


@dataclass
class Cfg:
    scale: float = 1.0


class Configured(Encoder):
    def forward(self, src, src_mask, cfg):
        return super().forward(src, src_mask) * cfg.scale


src = torch.tensor([[3, 4, 5, 0, 0, 0, 0], [6, 7, 8, 9, 10, 1, 2], [1, 2, 0, 0, 0, 0, 0]])
print(tuple(Configured()(src, (src != 0).unsqueeze(-2), Cfg()).shape))
"""


@pytest.fixture
def folder(tmp_path):
    """tmp_path with the model file and the program; the program's import of the model
    file is forgotten afterwards (the next test writes its own)."""
    write(tmp_path, "attn_model.py", MODEL)
    write(tmp_path, "train.py", PROGRAM)
    yield tmp_path
    sys.modules.pop("attn_model", None)


def write(folder, name: str, text: str) -> str:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def shapeguard(*args):
    return CliRunner().invoke(cli, [*map(str, args)])


def kept_run(folder):
    result = shapeguard("run", "--keep-inputs", folder / "kept", folder / "train.py")
    assert result.exit_code == 0, result.output
    return result


def one_line_error(result, text: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("shapeguard: error: ")
    assert result.stderr.count("\n") == 1
    assert text in result.stderr


def digest(path) -> dict:
    return {
        str(name.relative_to(path)): hashlib.sha256(name.read_bytes()).hexdigest()
        for name in sorted(path.rglob("*"))
        if name.is_file() and "__pycache__" not in name.parts
    }


def test_the_run_keeps_the_first_examples_of_the_real_inputs_and_is_unchanged(folder):
    plain = shapeguard("run", folder / "train.py")
    sys.modules.pop("attn_model", None)
    result = kept_run(folder)
    # The program's own output (its tensors untouched) and status are as without the option.
    assert result.stdout == plain.stdout == "(6, 7, 64) True\n"
    assert "kept the inputs of 1 module in" in result.stderr
    index = json.loads((folder / "kept" / "index.json").read_text())
    assert index["schema"] == "shapeguard.inputs" and index["schema_version"] == 1
    assert index["program"] == str(folder / "train.py") and index["argv"] == []
    (entry,) = index["modules"]
    assert (entry["module"], entry["class"]) == ("Encoder", "attn_model.Encoder")
    assert (entry["batch"], entry["examples"], entry["skipped"]) == (6, 4, [])
    assert entry["inputs"] == [
        {"name": "src", "value": "[4, 7] int64"},
        {"name": "src_mask", "value": "[4, 1, 7] bool"},
    ]
    data = torch.load(folder / "kept" / entry["file"], weights_only=True)
    src, mask = data["args"][0], data["kwargs"]["src_mask"]
    assert src.tolist()[1] == [6, 7, 8, 9, 10, 1, 2]  # the program's own ids, in order
    assert torch.equal(mask, (src != 0).unsqueeze(-2))
    # Cut tensors are saved alone, not as views of the whole batch's storage.
    assert src.untyped_storage().nbytes() == 4 * 7 * 8


def test_check_from_run_passes_on_the_real_inputs_with_nothing_made_up(folder):
    kept_run(folder)
    before = digest(folder)
    result = shapeguard("check", folder / "attn_model.py", "--from-run", folder / "kept")
    assert result.exit_code == 0, result.output
    inputs = result.stdout.splitlines()[1]
    assert inputs.startswith("inputs  src=[4, 7] int64, src_mask=[4, 1, 7] bool")
    assert f"(from the run of train.py kept in {folder / 'kept'}, 4 of 6 examples)" in inputs
    assert "made up" not in result.stdout
    # The key-padding probe read the program's own [B, 1, S] mask, the way the model applies it.
    padding = next(line for line in result.stdout.splitlines() if "key-padding" in line)
    assert "pass" in padding and "src_mask marks it False" in padding
    assert "11 checks: 7 passed, 4 n/a; passed" in result.stdout
    assert digest(folder) == before  # the kept inputs and the user's files untouched


def test_check_from_run_fails_the_probe_a_bug_breaks(folder):
    kept_run(folder)
    write(folder, "attn_model.py", BUGGY)
    result = shapeguard(
        "check", folder / "attn_model.py", "--from-run", folder / "kept", "--json", "-"
    )
    assert result.exit_code == 1, result.output
    statuses = {r["name"]: r["status"] for r in json.loads(result.stdout)["check"]["results"]}
    # Heads carved out of the sequence: the trace sees the view, and the probe that permutes
    # the heads sees them mixed on the program's own inputs; the examples stay apart.
    assert statuses["view_mixes_axes"] == "FAIL"
    assert statuses["head-permutation invariance"] == "FAIL"
    assert statuses["batch independence"] == "pass"
    assert "checks failed in" in result.stderr


def test_module_picks_the_kept_inputs_and_a_missing_one_is_one_line(folder):
    kept_run(folder)
    kept = folder / "kept"
    named = shapeguard(
        "check", folder / "attn_model.py", "--from-run", kept, "--module", "attn_model.Encoder"
    )
    assert named.exit_code == 0, named.output
    missing = shapeguard("check", folder / "attn_model.py", "--from-run", kept, "--module", "Dec")
    one_line_error(missing, f"{kept} has no inputs for Dec; it has inputs for: Encoder")
    other = shapeguard("check", folder / "attn_model.py", "--model", "Other", "--from-run", kept)
    one_line_error(other, "no inputs for Other (Other is the model built from FILE)")
    unfit = shapeguard(
        "check",
        folder / "attn_model.py",
        "--model",
        "Other",
        "--from-run",
        kept,
        "--module",
        "Encoder",
    )
    one_line_error(unfit, f"the inputs kept in {kept} do not fit Other.forward(x): ")


def test_a_bad_folder_is_one_line(folder):
    model = folder / "attn_model.py"
    one_line_error(shapeguard("check", model, "--from-run", folder / "nope"), "no such folder")
    empty = folder / "empty"
    empty.mkdir()
    one_line_error(shapeguard("check", model, "--from-run", empty), "no index.json in it")
    (empty / "index.json").write_text("{not json")
    one_line_error(shapeguard("check", model, "--from-run", empty), "index.json cannot be read")
    (empty / "index.json").write_text('{"schema": "shapeguard.run"}')
    one_line_error(shapeguard("check", model, "--from-run", empty), "not a shapeguard inputs index")
    kept_run(folder)
    kept = folder / "kept"
    (kept / "inputs-1.pt").write_bytes(b"not a torch file")
    one_line_error(shapeguard("check", model, "--from-run", kept), "inputs-1.pt cannot be read")
    # A file holding an arbitrary object is refused by weights_only: nothing of it is run.
    torch.save({"args": [print], "kwargs": {}}, kept / "inputs-1.pt")
    one_line_error(shapeguard("check", model, "--from-run", kept), "inputs-1.pt cannot be read")
    (kept / "inputs-1.pt").unlink()
    one_line_error(shapeguard("check", model, "--from-run", kept), "inputs-1.pt is missing")


def test_options_that_make_inputs_do_not_go_with_from_run(folder):
    model = folder / "attn_model.py"
    made = shapeguard("check", model, "--from-run", folder, "--input", "src=int64:3,7")
    one_line_error(made, "--input makes inputs; --from-run takes them all from")
    meta = shapeguard("check", model, "--from-run", folder, "--device", "meta")
    one_line_error(meta, "--from-run feeds recorded values: run it without --device meta")
    alone = shapeguard("check", model, "--module", "Encoder")
    one_line_error(alone, "--module NAME picks kept inputs: give --from-run DIR with it")


def test_an_object_argument_is_never_pickled_and_the_check_says_so(folder):
    write(folder, "configured.py", WITH_CONFIG)
    kept = folder / "kept"
    result = shapeguard("run", "--keep-inputs", kept, folder / "configured.py")
    assert result.exit_code == 0, result.output
    assert "Configured: no inputs kept: not kept: cfg (a Cfg)" in result.stderr
    (entry,) = json.loads((kept / "index.json").read_text())["modules"]
    assert entry["file"] is None and entry["skipped"] == [{"name": "cfg", "type": "Cfg"}]
    assert os.listdir(kept) == ["index.json"]
    checked = shapeguard(
        "check", folder / "attn_model.py", "--from-run", kept, "--module", "Configured"
    )
    one_line_error(checked, "the run kept no inputs for Configured: not kept: cfg (a Cfg)")


def test_keep_inputs_refuses_a_folder_of_other_files_before_the_program_runs(folder):
    (folder / "notes.txt").write_text("mine")
    result = shapeguard("run", "--keep-inputs", folder, folder / "train.py")
    one_line_error(result, "the folder holds other files; give a new or empty folder")
    assert (folder / "notes.txt").read_text() == "mine"
    # An earlier --keep-inputs folder is reused: its files replaced, the new run's kept.
    kept_run(folder)
    sys.modules.pop("attn_model", None)
    again = kept_run(folder)
    assert "kept the inputs of 1 module" in again.stderr
    assert sorted(os.listdir(folder / "kept")) == ["index.json", "inputs-1.pt"]


SEQ_FIRST = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(64, 2)  # batch_first=False: [seq, batch, d_model]

    def forward(self, x, pad):
        return self.attn(x, x, x, key_padding_mask=pad)[0]


torch.manual_seed(0)
x = torch.randn(7, BATCH, 64)
pad = torch.zeros(BATCH, 7, dtype=torch.bool)
pad[0, 5:] = True
print(tuple(Block()(x, pad).shape))
"""


@pytest.mark.parametrize(
    ("batch", "x", "pad", "examples"),
    [
        (6, "[7, 4, 64] float32", "[4, 7] bool", 4),  # cut on the batch axis the trace read
        (3, "[7, 3, 64] float32", "[3, 7] bool", None),  # no larger than the bound: whole
    ],
)
def test_the_cut_follows_the_batch_axis_the_trace_read_not_the_first(
    tmp_path, batch, x, pad, examples
):
    program = write(tmp_path, "seq_first.py", SEQ_FIRST.replace("BATCH", str(batch)))
    result = shapeguard("run", "--keep-inputs", tmp_path / "kept", program)
    assert result.exit_code == 0, result.output
    (entry,) = json.loads((tmp_path / "kept" / "index.json").read_text())["modules"]
    assert entry["inputs"] == [{"name": "x", "value": x}, {"name": "pad", "value": pad}]
    assert (entry["batch"], entry["examples"]) == (batch, examples)


def test_coincident_sizes_cut_the_batch_of_each_input(folder):
    # batch == seq == 7: the cut still takes examples, never positions.
    write(
        folder,
        "train.py",
        PROGRAM.replace("[9, 9, 0, 0, 0, 0, 0]]", "[9, 9, 0, 0, 0, 0, 0], [4, 4, 4, 0, 0, 0, 0]]"),
    )
    result = kept_run(folder)
    assert result.stdout == "(7, 7, 64) True\n"
    (entry,) = json.loads((folder / "kept" / "index.json").read_text())["modules"]
    assert (entry["batch"], entry["examples"]) == (7, 4)
    data = torch.load(folder / "kept" / entry["file"], weights_only=True)
    assert data["args"][0].tolist()[2] == [1, 2, 0, 0, 0, 0, 0]  # whole rows: examples
    assert list(data["kwargs"]["src_mask"].shape) == [4, 1, 7]


def test_keep_inputs_goes_with_check_and_the_probes_see_the_whole_call(folder):
    result = shapeguard(
        "run", "--check", "--keep-inputs", folder / "kept", "--json", folder / "run.json",
        folder / "train.py",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (module,) = json.loads((folder / "run.json").read_text())["modules"]
    assert module["check"]["passed"]
    # --check probes the call as the program made it: all 6 examples, not the kept 4.
    batch = next(r for r in module["check"]["results"] if r["name"] == "batch independence")
    assert "of 6" in batch["detail"]
    (entry,) = json.loads((folder / "kept" / "index.json").read_text())["modules"]
    assert (entry["batch"], entry["examples"]) == (6, 4)


def test_a_module_program_is_named_in_the_index_and_the_inputs_line(folder, monkeypatch):
    monkeypatch.chdir(folder)
    result = shapeguard("run", "--keep-inputs", "kept", "-m", "train", "--lr", "3")
    assert result.exit_code == 0, result.output
    index = json.loads((folder / "kept" / "index.json").read_text())
    assert (index["program"], index["module_program"]) == (None, "train")
    assert (index["argv"], index["cwd"]) == (["--lr", "3"], str(folder))
    checked = shapeguard("check", "attn_model.py", "--from-run", "kept")
    assert checked.exit_code == 0, checked.output
    assert "(from the run of train kept in kept, 4 of 6 examples)" in checked.stdout


def test_a_folder_that_cannot_be_written_after_the_run_still_reports(folder, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    result = shapeguard("run", "--keep-inputs", folder / "kept", folder / "train.py")
    assert result.exit_code == 0, result.output
    assert result.stdout == "(6, 7, 64) True\n"
    assert f"cannot write the kept inputs into {folder / 'kept'}: [Errno 28] No space" in (
        result.stderr
    )
    assert "1 module traced, 0 findings; exit status 0" in result.stderr
    assert not (folder / "kept" / "index.json").exists()


def test_a_model_built_with_other_sizes_crashes_with_a_hint_to_pass_the_programs(folder):
    kept_run(folder)
    result = shapeguard(
        "check", folder / "attn_model.py", "--model", "Encoder", "--arg", "vocab=5",
        "--from-run", folder / "kept",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "forward raised IndexError: index out of range in self" in result.stdout
    assert "      x = self.emb(src)" in result.stdout
    assert (
        f"  hint: the inputs are from the run of train.py kept in {folder / 'kept'}, 4 of 6 "
        "examples; if the file builds the model with other sizes than the program did, they "
        "do not fit it: pass the program's sizes with --arg"
    ) in result.stdout
