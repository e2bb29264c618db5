"""The trace: one TorchFunctionMode and module hooks per session (`session`), the
calls it intercepts (`call`), the names and roles of their tensors (`meta`), what it
records (`record`: plain data), torch's composites it keeps on their fast paths
(`composites`), what observers of a session are told (`observe`), config checks at construction (`construction`), flash-attn's wrapped
entry points (`flash`), replayed sessions (`replay`), DTensor records (`tp_session`),
and the one way to open a session for one forward (`tracing`).

Builds on the checks and the vocabulary; report, contracts, guard, probes and the
public `shapeguard.trace` build on it.
"""
