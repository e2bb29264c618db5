"""The package as users get it: `python -m build` makes an sdist and, from it, a wheel; the
wheel holds the package, its typed marker, the license and the entry points, and nothing
else; the metadata says what the index shows (name, version, Python and torch, classifiers,
the README). Built once per module in a temporary folder (a few seconds); CI installs the
wheel into a fresh virtualenv and runs it (.ci/wheel)."""

import pathlib
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile

import pytest
from packaging.metadata import Metadata
from packaging.requirements import Requirement
from packaging.version import Version

pytestmark = pytest.mark.no_shapeguard  # builds in a subprocess: nothing to trace

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
NAME = "shapeguard_attn"


def _version() -> str:
    text = (ROOT / "shapeguard" / "_version.py").read_text()
    return re.search(r'__version__ = "([^"]+)"', text).group(1)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> pathlib.Path:
    """The folder `python -m build` wrote the sdist and the wheel to (the wheel built from
    the unpacked sdist, as build does; the backend from this environment)."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _wheel(dist: pathlib.Path) -> zipfile.ZipFile:
    (path,) = dist.glob("*.whl")
    assert path.name == f"{NAME}-{_version()}-py3-none-any.whl"
    return zipfile.ZipFile(path)


def _metadata(dist: pathlib.Path) -> Metadata:
    text = _wheel(dist).read(f"{NAME}-{_version()}.dist-info/METADATA")
    return Metadata.from_email(text, validate=True)  # raises on any invalid field


def test_the_wheel_holds_the_package_and_nothing_else(dist):
    names = set(_wheel(dist).namelist())
    info = f"{NAME}-{_version()}.dist-info"
    package = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "shapeguard").rglob("*")
        if path.is_file() and path.suffix in (".py", ".typed")
    }
    assert "shapeguard/py.typed" in package and "shapeguard/__init__.py" in package
    expected = package | {
        f"{info}/{name}" for name in ("METADATA", "WHEEL", "RECORD", "entry_points.txt")
    }
    expected.add(f"{info}/licenses/LICENSE")
    assert names == expected, (sorted(names - expected), sorted(expected - names))


def test_the_wheel_declares_the_command_and_the_pytest_plugin(dist):
    text = _wheel(dist).read(f"{NAME}-{_version()}.dist-info/entry_points.txt").decode()
    sections: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
        elif "=" in line:
            key, _, value = line.partition("=")
            current[key.strip()] = value.strip()
    assert sections == {
        "console_scripts": {"shapeguard": "shapeguard._cli.commands:main"},
        "pytest11": {
            "shapeguard": "shapeguard._plugin.plugin",
            "shapeguard_ini": "shapeguard._plugin.ini",
        },
    }


def test_the_metadata_is_what_the_index_shows(dist):
    meta = _metadata(dist)
    assert meta.name == "shapeguard-attn"
    assert meta.version == Version(_version())
    assert str(meta.requires_python) == ">=3.11"
    assert meta.license_expression == "MIT"
    assert meta.license_files == ["LICENSE"]
    assert meta.description_content_type == "text/markdown"
    assert meta.description == (ROOT / "README.md").read_text()
    assert meta.summary and len(meta.summary) < 200
    classifiers = set(meta.classifiers or [])
    assert {"Programming Language :: Python :: 3.11", "Typing :: Typed"} <= classifiers
    assert not any(c.startswith("License ::") for c in classifiers)  # PEP 639: the expression


def test_the_torch_the_package_accepts_starts_at_the_one_ci_tests(dist):
    """`torch>=X.Y` with X.Y the pinned torch's (constraints/test.txt): releases before it
    are not tested, so the package does not claim them."""
    requires: dict[str, Requirement] = {r.name: r for r in _metadata(dist).requires_dist or []}
    pinned = next(
        line.split("==")[1]
        for line in (ROOT / "constraints" / "test.txt").read_text().splitlines()
        if line.startswith("torch==")
    )
    torch = requires["torch"]
    assert str(torch.specifier) == f">={'.'.join(pinned.split('.')[:2])}"
    assert torch.specifier.contains(pinned)
    assert not torch.marker
    # the extras are optional: flash-attn only with [flash]
    assert str(requires["flash-attn"].marker) == 'extra == "flash"'


def test_the_sdist_holds_the_sources_and_no_build_leftovers(dist):
    (path,) = dist.glob("*.tar.gz")
    assert path.name == f"{NAME}-{_version()}.tar.gz"
    top = f"{NAME}-{_version()}"
    with tarfile.open(path) as sdist:
        names = {name.removeprefix(top + "/") for name in sdist.getnames()}
    for needed in ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "PKG-INFO"):
        assert needed in names
    assert "shapeguard/_version.py" in names and "tests/test_packaging.py" in names
    roots = {name.split("/")[0] for name in names if name != top}
    assert roots == {
        "shapeguard",
        "tests",
        "examples",
        "docs",
        "README.md",
        "CHANGELOG.md",
        "LICENSE",
        "pyproject.toml",
        "PKG-INFO",
        ".gitignore",  # hatchling's own: the sdist builds the wheel with the same exclusions
    }, roots
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".whl"))]


def test_the_build_settings_name_what_the_tests_check():
    """The wheel's package list and the sdist's anchored include list are the settings the
    tests above read through a build; the version has one source."""
    hatch = PROJECT["tool"]["hatch"]
    assert hatch["version"] == {"path": "shapeguard/_version.py"}
    assert hatch["build"]["targets"]["wheel"]["packages"] == ["shapeguard"]
    assert all(p.startswith("/") for p in hatch["build"]["targets"]["sdist"]["include"])
    assert PROJECT["project"]["dynamic"] == ["version"]
