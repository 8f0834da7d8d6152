"""The memory log: the source of truth of mnesio. Every other view (cartridges included) is a function of it.

Rows are append-only (PostgreSQL triggers refuse UPDATE, DELETE and TRUNCATE), numbered by a global ``seq``
with no gaps in commit order, and sealed with AES-256-GCM under per-memory keys wrapped by the subject's or
scope's key, itself wrapped by the master key; plaintext is never stored or logged. Shredding a key erases
its memories for good (they open as ``erased=True``); erasure requests record their progress as events and
run the view rebuilders registered in ``memories.registry``. memories never imports cartridges.

Design (rows, sealing, shred, immutability, erasure, forgetting): docs/design/memory-log.md.
"""
