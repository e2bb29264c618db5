"""Names in a trace: what each axis of each tensor is, from where it came (provenance).

`dims` holds the algebra (an axis is a list of factors of dims), `flow` the rule
of each op family, `roots` the reading of a model's own inputs, and `naming`
turns provenance into the names users read (batch, seq_q, heads, d_k, ...).
"""
