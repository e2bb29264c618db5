"""Inputs shapeguard makes up, on correct models written as real repositories write them
(issue 30's list): no finding, or a message that says the input was made up and how to
pass a real one.

- the Annotated Transformer's `src_mask`, `[batch, 1, seq]`, unsqueezed per head;
- token ids that avoid the model's padding id (zeros are the pad id of both seq2seq repos);
- a target sequence compared with its pad id before its embedding reads it (hyunwoongko's
  `make_trg_mask`): ids, not float activations;
- `--input targets=int64:...` (nanoGPT's loss targets): ids, not zeros read as padding.
"""

import re
import textwrap

import pytest
from click.testing import CliRunner

from shapeguard._cli.commands import cli

pytestmark = pytest.mark.no_shapeguard


def write(tmp_path, source: str, name: str = "model.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def clean(result) -> None:
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.stdout.rstrip().splitlines()[-1].endswith("0 errors, 0 warnings")


ANNOTATED = """
import math

from torch import nn


class Encoder(nn.Module):
    def __init__(self, vocab=11, d=32, h=4):
        super().__init__()
        self.emb, self.qkv, self.h, self.dk = nn.Embedding(vocab, d), nn.Linear(d, 3 * d), h, d // h

    def forward(self, src, src_mask):
        x = self.emb(src)
        B, T, C = x.shape
        mask = src_mask.unsqueeze(1)  # [B, 1, 1, T]: the same mask for every head
        q, k, v = (t.view(B, T, self.h, self.dk).transpose(1, 2) for t in self.qkv(x).split(C, 2))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.dk)
        scores = scores.masked_fill(mask == 0, -1e9)
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
"""


def test_a_mask_takes_the_rank_the_code_unsqueezes_it_from(tmp_path):
    result = run("trace", write(tmp_path, ANNOTATED))
    clean(result)
    assert result.stdout.splitlines()[1] == (
        "inputs  src=[2, 5] int64 (ids < 11), src_mask=[2, 1, 5] bool (True = real token; "
        "lengths 5, 3)  (made up from the model's structure: batch=2, seq=5)"
    )
    # The injected bug of the field report is still found on the inputs made up.
    buggy = ANNOTATED.replace("src_mask.unsqueeze(1)", "src_mask.unsqueeze(-1)")
    found = run("trace", write(tmp_path, buggy, "buggy.py"))
    assert found.exit_code == 1, found.stdout + found.stderr
    assert "warning: masked_fill: mask == 0 [2, 1, 5, 1] varies along seq_q" in found.stdout


PADDED = """
from torch import nn


class Tagger(nn.Module):
    def __init__(self, vocab=11, d=32, pad_idx=0):
        super().__init__()
        self.pad_idx = pad_idx
        self.emb = nn.Embedding(vocab, d, padding_idx=pad_idx)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)

    def forward(self, src):
        x = self.emb(src)
        out, _ = self.attn(x, x, x, key_padding_mask=src == self.pad_idx)
        return out
"""


def test_made_up_ids_avoid_the_padding_id(tmp_path):
    result = run("trace", write(tmp_path, PADDED))
    clean(result)
    assert result.stdout.splitlines()[1].startswith("inputs  src=[2, 5] int64 (ids 1..10)  ")
    config = write(
        tmp_path,
        PADDED.replace("padding_idx=pad_idx", "padding_idx=None").replace(
            "self.pad_idx = pad_idx", "self.pad_idx = 3"
        ),
        "config_pad.py",
    )
    result = run("trace", config)
    clean(result)
    assert result.stdout.splitlines()[1].startswith("inputs  src=[2, 5] int64 (ids 0..10 but 3)")
    hf_style = write(
        tmp_path,
        PADDED.replace("padding_idx=pad_idx", "padding_idx=None")
        .replace(
            "self.pad_idx = pad_idx",
            "self.config = __import__('types').SimpleNamespace(pad_token_id=7)",
        )
        .replace("src == self.pad_idx", "src == self.config.pad_token_id"),
        "hf_pad.py",
    )
    result = run("trace", hf_style)
    clean(result)
    assert result.stdout.splitlines()[1].startswith("inputs  src=[2, 5] int64 (ids 0..10 but 7)")


SEQ2SEQ = """
import torch
from torch import nn


class Seq2Seq(nn.Module):
    def __init__(self, vocab=13, d=32, heads=4, pad=0):
        super().__init__()
        self.trg_pad_idx, self.h = pad, heads
        self.src_emb = nn.Embedding(vocab, d, padding_idx=pad)
        self.emb = nn.Embedding(vocab, d, padding_idx=pad)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, vocab)

    def make_trg_mask(self, trg):
        pad = (trg != self.trg_pad_idx).unsqueeze(1).unsqueeze(3)  # [B, 1, T, 1]
        T = trg.shape[1]
        sub = torch.tril(torch.ones(T, T)).type(torch.ByteTensor)  # [T, T]
        return pad & sub  # [B, 1, T, T]

    def forward(self, src, trg):
        mask = self.make_trg_mask(trg)
        x = self.emb(trg) + self.src_emb(src).mean(1, keepdim=True)
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in self.qkv(x).split(C, 2))
        scores = (q @ k.transpose(-2, -1)) / (C // self.h) ** 0.5
        scores = scores.masked_fill(mask == 0, -10000)
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
        return self.out(y)
"""


def test_an_input_compared_with_its_pad_id_is_made_as_ids_not_floats(tmp_path):
    result = run("trace", write(tmp_path, SEQ2SEQ))
    clean(result)
    assert result.stdout.splitlines()[1].startswith(
        "inputs  src=[2, 5] int64 (ids 1..12), trg=[2, 5] int64 (ids 1..12)  (made up from "
    )
    # Sized by hand, the ids still avoid the pad id (zeros made every query's row hidden).
    given = run("trace", write(tmp_path, SEQ2SEQ), "--input", "trg=int64:2,6")
    clean(given)
    assert "trg=[2, 6] int64 (ids 1..12)" in given.stdout.splitlines()[1]


TINY_LM = """
import torch.nn.functional as F
from torch import nn

SEEN = []


class TinyLM(nn.Module):
    def __init__(self, vocab=50, d=32, heads=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.head = nn.Linear(d, vocab)
        self.h = heads

    def forward(self, idx, targets=None):
        x = self.emb(idx)
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        logits = self.head(y.transpose(1, 2).reshape(B, T, C))
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
"""


def test_integer_targets_are_ids_not_zeros_read_as_padding(tmp_path):
    path = write(tmp_path, TINY_LM)
    result = run("trace", path, "--input", "targets=int64:2,5")
    clean(result)
    assert "targets=[2, 5] int64 (ids < 50)" in result.stdout.splitlines()[1]
    checked = run("check", path, "--input", "targets=int64:2,5")
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    assert re.search(r"key-padding invariance +│ n/a +│ no input is a padding mask", checked.stdout)
    assert "FAIL" not in checked.stdout


# -- a false error caused by a made-up input, and real bugs on made-up inputs -----------------

VIEWED_MASK = """
import math

from torch import nn


class Decoder(nn.Module):
    def __init__(self, vocab=11, d=32, h=4):
        super().__init__()
        self.emb, self.qkv, self.h, self.dk = nn.Embedding(vocab, d), nn.Linear(d, 3 * d), h, d // h

    def forward(self, tgt, tgt_mask):
        x = self.emb(tgt)
        B, T, C = x.shape
        mask = tgt_mask.view(B, 1, T, T)  # tgt_mask is [B, T, T]: padding and the future
        q, k, v = (t.view(B, T, self.h, self.dk).transpose(1, 2) for t in self.qkv(x).split(C, 2))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.dk)
        scores = scores.masked_fill(mask == 0, -1e9)
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
"""


def test_a_failure_on_a_made_up_input_is_a_usage_line_not_a_bug(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, VIEWED_MASK)
    result = run("trace", path)
    assert result.exit_code == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "shapeguard: error: could not make a valid input for tgt_mask (made up: tgt_mask "
        "[2, 5] bool, True = real token; lengths 5, 3): the forward fails on it at model.py:15 "
        "(shape '[2, 1, 5, 5]' is invalid for input of size 10); pass --input tgt_mask=SIZES "
        "or use `shapeguard run`"
    ]
    # The real input, passed as the line says, traces clean.
    clean(run("trace", path, "--input", "tgt_mask=bool:2,5,5"))


def test_a_real_bug_at_a_line_that_reads_no_made_up_input_is_still_a_bug(tmp_path):
    buggy = ANNOTATED.replace(
        "(scores.softmax(-1) @ v).transpose(1, 2)", "(scores.softmax(-1) @ v)"
    )
    result = run("trace", write(tmp_path, buggy))
    assert result.exit_code == 1, result.stdout + result.stderr
    assert result.stderr.startswith("shapeguard: 1 warning in ")
    finding = result.stdout[result.stdout.index("\nwarning: ") + 1 :].splitlines()
    assert finding[0].startswith(
        "warning: (scores.softmax(-1) @ v).reshape(2, 5, 32): merges heads back before moving them"
    )
    assert finding[3] == "  (scores.softmax(-1) @ v)  [batch=2, heads=4, seq_q=5, d_k=8] float32"
    assert finding[4].startswith("  hint: transpose first")
    assert "made up:" not in "\n".join(finding)


def test_a_real_crash_on_a_made_up_input_its_consumer_accepted_is_still_a_bug(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    # x is read by a Linear first, which takes it as made; the view after is the bug.
    path = write(
        tmp_path,
        """
        from torch import nn


        class Block(nn.Module):
            def __init__(self, d=32, heads=4):
                super().__init__()
                self.proj, self.h = nn.Linear(d, d), heads

            def forward(self, x):
                h = self.proj(x)
                B, T, C = x.shape
                return x.view(B, T, self.h + 1, C // self.h) + h.mean()
        """,
    )
    result = run("trace", path)
    assert result.exit_code == 1, result.stdout + result.stderr
    assert "could not make a valid input" not in result.stdout + result.stderr
    assert "\nerror: x.view(2, 5, 5, 8): x has 320 elements" in result.stdout
    assert "  in  Block at model.py:13\n" in result.stdout
    # The error involves the made-up x, and says so.
    assert "  made up: x [2, 5, 32] float32 (shapeguard made it; " in result.stdout


def test_a_finding_at_a_line_that_reads_a_made_up_input_says_it_was_made_up(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    buggy = ANNOTATED.replace("src_mask.unsqueeze(1)", "src_mask.unsqueeze(-1)")
    result = run("trace", write(tmp_path, buggy))
    assert result.exit_code == 1, result.stdout + result.stderr
    finding = result.stdout[result.stdout.index("warning: masked_fill") :].splitlines()
    assert finding[1:5] == [
        "  in  Encoder at model.py:18",
        "      scores = scores.masked_fill(mask == 0, -1e9)",
        "  mask == 0  [batch=2, 1, seq=5, 1] bool",
        "  made up: src_mask [2, 1, 5] bool, True = real token; lengths 5, 3 (shapeguard made "
        "it; pass the real one with --input src_mask=SIZES, or use `shapeguard run`)",
    ]
    assert finding[5].startswith("  hint: a padding mask belongs on the key axis")
