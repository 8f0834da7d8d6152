"""The search index (memories.search_index): BM25 postings kept up to date by appends and erasures."""
from __future__ import annotations

from django.db import models
from django.utils import timezone

from memories.models.keys import Subject, key_xor_shredded
from memories.models.log import Memory
from memories.models.scopes import Scope

# The search index's current tokenizer (memories.search_index.TOKENIZERS): 1 lower-cased words, 2 the same
# Porter-stemmed. A new index is built with it.
SEARCH_TOKENIZER = 2


class SearchIndex(models.Model):
    """A scope's search index: the secret of its term digests (HMAC-SHA256), wrapped by the master key, and the
    totals BM25 needs (documents and their summed length), kept by the same transactions as the postings.

    Terms are stored only as digests under this key, so the index holds no plaintext word, and once the key is
    shredded (the scope deleted) nobody can test a guessed word against what is left. A key of its own, not one
    derived from the scope key: a backfill re-keys the scope key, and every digest would change with it.
    """

    scope = models.OneToOneField(Scope, on_delete=models.PROTECT, related_name="search_index")
    wrapped_key = models.BinaryField(null=True)  # NULL once shredded
    wrapped_by = models.CharField(max_length=16, help_text="id of the master key that wrapped it")
    created_at = models.DateTimeField(default=timezone.now)
    shredded_at = models.DateTimeField(null=True, blank=True)
    num_documents = models.BigIntegerField(default=0)
    total_length = models.BigIntegerField(default=0)  # in tokens: the mean document length is this / num_documents
    # +1 by every change other than an append (an erasure, a backfill): a process's cached postings of this scope
    # (memories.search_index) are then dropped; an append only adds seqs past the scope's head, read as a delta
    generation = models.BigIntegerField(default=0)
    # how its postings were tokenized (memories.search_index.TOKENIZERS): searches and appends of the scope use
    # this one; search_index_backfill rebuilds an index of an older one with the current one
    tokenizer = models.PositiveSmallIntegerField(default=SEARCH_TOKENIZER)

    class Meta:
        constraints = [
            key_xor_shredded("memories_searchindex_key_xor_shredded"),
        ]


class SearchTerm(models.Model):
    """How many of a scope's indexed memories hold a term (BM25's document frequency), by the term's digest.

    Kept so that a search knows each query term's weight before reading any posting, and can skip the postings
    of frequent terms that cannot change the top results (memories.search_index.rank). A term no memory holds
    any more is deleted with the erasure that took its last memory.
    """

    pk = models.CompositePrimaryKey("scope", "term")
    scope = models.ForeignKey(Scope, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+")
    term = models.BigIntegerField()
    df = models.BigIntegerField()


class SearchDocument(models.Model):
    """One indexed memory: its length in tokens (BM25's document length) and what the search filters on.

    Written in the append's transaction, deleted in the erasure's; the postings repeat ``length`` so that
    scoring reads only them (an index-only scan), and this table gives the scope's document count and mean length.
    """

    memory = models.OneToOneField(
        Memory, on_delete=models.DO_NOTHING, to_field="seq", db_column="seq", primary_key=True,
        related_name="search_document",
    )
    scope = models.ForeignKey(Scope, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    subject = models.ForeignKey(Subject, on_delete=models.DO_NOTHING, db_constraint=False, null=True, related_name="+")
    created_at = models.DateTimeField()
    length = models.PositiveIntegerField()

    class Meta:
        indexes = [models.Index(fields=["scope", "memory", "length"], name="memories_searchdoc_scope")]


class SearchPosting(models.Model):
    """A term of one indexed memory: the term's digest under the scope's SearchIndex key and its count there.

    The primary key (seq, term) is what an erasure deletes by; the (scope, term, seq, tf, length) index is what
    scoring reads, without touching the table.
    """

    pk = models.CompositePrimaryKey("seq", "term")
    seq = models.BigIntegerField()
    term = models.BigIntegerField()  # the first 8 bytes of HMAC-SHA256(scope's index key, term), signed
    # no index of its own: the (scope, term, ...) index below starts with it
    scope = models.ForeignKey(Scope, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+")
    tf = models.PositiveIntegerField()
    length = models.PositiveIntegerField()  # the memory's length in tokens (SearchDocument.length)

    class Meta:
        indexes = [models.Index(fields=["scope", "term", "seq", "tf", "length"], name="memories_searchposting_term")]
