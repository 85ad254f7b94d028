"""The probe path language in parts; `mlatrace.probe.paths` is its face (import from there).

parser: the tokenizer and the parser (text -> tree); values: host-side reads of tensors
and objects (never a device read) and plain(); evaluate: trees -> closure chains, and the
record assembled from them; codegen: one straight-line function per bound target.
"""
