"""Kinds reported outside any rule, declared here so the catalogue holds every kind.

The session reports torch's own errors (`torch_error`) and contracts report their
broken clauses (`contract`); those modules sit above the checks, so they cannot be
imported from here. They use these names; `kinds()` finds them with the rules.
"""

from . import ERROR, WARNING, declare

declare("session", {"torch_error": ERROR})
declare("contracts", {"contract": (ERROR, WARNING)})
