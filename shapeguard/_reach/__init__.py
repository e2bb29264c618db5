"""Attention reach: which keys each query of an attention site can see.

Computed from the values that reach softmax or the kernel, whatever code built them
(`rows.Reach.from_visible`), and stored compactly as runs of visible keys per distinct
row, never the scores. torch is imported lazily, inside the functions that need it.
"""
