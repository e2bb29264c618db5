"""The pytest plugin's ini keys and markers, under a pytest11 entry point of their own
(`shapeguard_ini`).

`-p no:shapeguard`, the documented off switch, keeps pytest from loading the plugin,
and with it the declaration of its ini keys: a project whose ini sets
`shapeguard = true` would then get "Unknown config option: shapeguard", which
`filterwarnings = error` turns into an error before collection. This module is not
blocked by that switch, declares the keys (they then do nothing) and, when the plugin
is off, its markers, so `--strict-markers` still collects marked tests. Pure Python,
imports nothing: loading it costs nothing.
"""

MARKERS = (
    "shapeguard(mode='raise', strict=False): run this test inside a shapeguard trace; "
    "a shape violation fails it",
    "no_shapeguard: never trace this test (for tests that trigger shape violations on purpose)",
)


def add_ini_keys(parser) -> None:
    """Declare the plugin's ini keys (declaring them twice is harmless)."""
    parser.addini(
        "shapeguard", "run every test inside a shapeguard trace", type="bool", default=False
    )
    parser.addini(
        "shapeguard_mode", "raise or warn (see --shapeguard-mode)", type="string", default="raise"
    )
    parser.addini(
        "shapeguard_strict",
        "ShapeWarnings fail the test (see --shapeguard-strict)",
        type="bool",
        default=False,
    )


def pytest_addoption(parser) -> None:
    add_ini_keys(parser)


def pytest_configure(config) -> None:
    if not config.pluginmanager.has_plugin("shapeguard"):
        for marker in MARKERS:
            config.addinivalue_line("markers", marker)
