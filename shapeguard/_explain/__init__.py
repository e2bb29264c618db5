"""`shapeguard explain`: a pasted error or traceback read back as the shape relation
that broke, with the fix (torch's messages, flash-attn's, shapeguard's own).
"""
