"""Shared test setup: pytester runs real pytest sessions (the plugin's tests use it)."""

pytest_plugins = ["pytester"]
