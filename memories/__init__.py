"""The memory log: the source of truth of mnesio. Every other view (cartridges included) is a function of it.

Decisions (the README is written from these):

- Rows: ``Memory(seq, scope, subject, created_at, idempotency_key, nonce, ciphertext)``. ``seq`` is global,
  strictly increasing, 1..N with no gaps: it is taken from a one-row counter (``LogHead``) that the append
  transaction locks first and holds until commit, so seqs become visible in commit order and a failed or
  refused append rolls its seq back. A read "as of" head H returns exactly the rows with seq <= H.
- Sealing: AES-256-GCM with associated data ``(seq, scope id, subject id)``; the data key is the subject's
  (or the scope's for memories without a subject), stored only wrapped by the master key, with the id of the
  master key that wrapped it. Plaintext is never stored, logged, put in task arguments or shown in the admin.
- Shred: sets the subject's key bytes to NULL for good (a check constraint ties "shredded" to "no key bytes").
  Its memories stay in the log and open as ``erased=True, text=None``. A new memory for a shredded subject
  is refused (409 naming `subject`): no key is silently recreated; a new person needs a new subject id.
- Immutability: PostgreSQL triggers (pgtrigger) reject UPDATE, DELETE and TRUNCATE of memories, erasure
  requests and events, the seq counter (which may only move forward by one) and keys (which allow only the
  one-way shred and a re-wrap by a new master key), from any SQL client. On SQLite only the ORM enforces this.
- Erasure requests: append-only status events ``requested -> keys_shredded -> views_rebuilt``, or ``failed``
  with the reason (processing again resumes; the task retries). Processing runs every view rebuilder that
  derived views registered in ``memories.registry``.
- Size limit: ``MNESIO_MAX_MEMORY_BYTES`` (default 8192) bytes of UTF-8 per memory.
"""
