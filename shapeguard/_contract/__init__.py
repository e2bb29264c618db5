"""Shape contracts: `@shapeguard.contract` and jaxtyping annotations, compiled once and
checked against a call's arguments, their failures explained in the house message.

Builds on the trace (a contract checks inside the session) and the vocabulary; nothing
below imports it.
"""
