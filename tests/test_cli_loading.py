"""Loading a model file as `python FILE` runs it (issue 30): the file's folder first on the
path, the package around it imported only when the file asks for it, and the interpreter's
path and modules put back afterwards.

The layouts are those of real repositories: a module named like its package
(lucidrains/x-transformers' `x_transformers/x_transformers.py`), and a file inside a package
whose `__init__` imports something not installed (vit-pytorch, CLIP and segment-anything
import torchvision there).
"""

import sys
import textwrap

import pytest
from click.testing import CliRunner

from shapeguard._cli.commands import cli
from shapeguard._cli.loader import LoadError, asks_for_package, loaded

pytestmark = pytest.mark.no_shapeguard

ATTENTION = """
import torch.nn.functional as F
from torch import nn


class Attn(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.qkv, self.h = nn.Linear(d, 3 * d), {heads}

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (
            t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in self.qkv(x).split(C, 2)
        )
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
"""


def tree(root, files: dict) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def clash(tmp_path):
    """x-transformers' layout: attnpkg/attnpkg.py imports attnpkg.helpers by name, and the
    package's `__init__` imports the module back."""
    tree(
        tmp_path,
        {
            "attnpkg/__init__.py": "from attnpkg.attnpkg import Attn\n",
            "attnpkg/helpers.py": "def heads(d):\n    return d // 16\n",
            "attnpkg/attnpkg.py": "from attnpkg.helpers import heads\n"
            + ATTENTION.format(heads="heads(d)"),
        },
    )
    return tmp_path / "attnpkg" / "attnpkg.py"


def test_a_module_named_like_its_package_loads_by_path(tmp_path, monkeypatch):
    path = clash(tmp_path)
    monkeypatch.chdir(tmp_path)
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    result = run("trace", "attnpkg/attnpkg.py")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.stdout.startswith("model   Attn\n")
    assert "0 errors, 0 warnings" in result.stdout
    assert sys.path == saved_path
    assert not [name for name in set(sys.modules) - saved_modules if name.startswith("attnpkg")]
    with loaded(str(path)) as module:
        assert module.__name__ == "attnpkg.attnpkg"
        assert sys.path[0] == str(tmp_path)  # the package's parent, so attnpkg is the package
        assert module.heads(32) == 2


def test_a_file_whose_package_init_fails_loads_as_python_runs_it(tmp_path):
    tree(
        tmp_path,
        {
            "heavypkg/__init__.py": "import not_installed_vision_library_xyz\n",
            "heavypkg/sibling.py": "HEADS = 4\n",
            "heavypkg/vit.py": "from sibling import HEADS\n" + ATTENTION.format(heads="HEADS"),
        },
    )
    path = tmp_path / "heavypkg" / "vit.py"
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    result = run("trace", path)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "0 errors, 0 warnings" in result.stdout
    with loaded(str(path)) as module:
        assert sys.path[0] == str(path.parent)  # the file's folder first, as Python puts it
        assert module.__name__ == "vit"
        assert "heavypkg" not in sys.modules  # the package around it was never imported
        assert module.HEADS == 4
    assert sys.path == saved_path
    assert set(sys.modules) - saved_modules == set()


def test_a_file_that_imports_its_failing_package_says_what_failed(tmp_path):
    tree(
        tmp_path,
        {
            "heavypkg/__init__.py": "import not_installed_vision_library_xyz\n",
            "heavypkg/vit.py": "from . import helpers\n",
            "heavypkg/helpers.py": "",
        },
    )
    saved_path = list(sys.path)
    missing = "No module named 'not_installed_vision_library_xyz'"
    with pytest.raises(LoadError, match=missing), loaded(str(tmp_path / "heavypkg" / "vit.py")):
        pass
    assert sys.path == saved_path
    assert "heavypkg" not in sys.modules


def test_asking_for_the_package_is_read_from_the_imports(tmp_path):
    cases = {
        "from . import x\n": True,
        "from .layers import Attention\n": True,
        "import mypkg.helpers\n": True,
        "def f():\n    from mypkg import helpers\n": True,
        "import torch\nfrom torch import nn\n": False,
        "import mypkgother\nfrom helpers import x\n": False,
    }
    for text, asks in cases.items():
        path = tmp_path / "model.py"
        path.write_text(text)
        assert asks_for_package(str(path), "mypkg") is asks, text
