"""The trace: a session per trace and thread (`session`), made of parts, one concern
each: the interceptor, the TorchFunctionMode that hands it every call (`interceptor`);
the replay layer it consults first (`replay_layer`, over recorded steps: `replay`, their
comparison with a call: `replay_match`, their effects on the axes: `replay_effects`,
effects made when read: `owed`); the reference path's module stack (`module_stack`),
naming of tensors first seen (`naming`), recording (`recording`) and reporting
(`findings`), on the state they share (`session_state`). Below them: the calls it
intercepts (`call`), the names and roles of their tensors (`meta`), what it records
(`record`: plain data), torch's composites it keeps on their fast paths (`composites`),
what observers of a session are told (`observe`), config checks at construction
(`construction`), flash-attn's wrapped entry points (`flash`) and torch's (`flex_attention`,
`varlen_attn`: `torch_entries`), both bound through `rebinding`, tensor parallelism's state,
the session's one member for it (`tp_session`), contained failures (`internal`), and the
one way to open a session for one forward (`opening`: `recording_session`, `begin`).

Builds on the checks and the vocabulary; report, contracts, guard, probes and the
public `shapeguard.trace` build on it.
"""
