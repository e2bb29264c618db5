"""The decode-consistency probe (stub)."""

from .result import not_applicable


def decode_consistency(s):
    return not_applicable("decode consistency", "not yet")
