"""`shapeguard diff`: where two runs that should agree part ways, and why.

Two implementations of the same attention (a reference and a port, two backends, two
dtypes) run on the same seeded inputs with matched weights; their tensors are aligned
by what each is (module path and role: layer 3's Q, K after rotary, scores, attn,
context, block output), not by op order; the first aligned pair that diverges beyond
the dtype's tolerance is reported, and `explain.name_difference` tests a bounded set
of transformations that would explain it (a transpose, heads grouped the other way,
rotary pairs interleaved against half-split, a constant scale, a shift by one, ...).
"""
