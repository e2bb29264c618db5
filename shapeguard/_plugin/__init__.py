"""The pytest plugin: every test traced, shape findings reported in pytest's summary.

Loaded by pytest in every run of every project that installs shapeguard, so it imports
neither torch nor click at import; the ini keys live apart so `-p no:shapeguard` keeps
a project's ini valid.
"""
