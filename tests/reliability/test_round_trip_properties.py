"""Property tests (hypothesis) of seal/open: any text round-trips through the log, any other row or byte fails.

Quantize/dequantize round trips are property-tested in tests/kvengine/test_kv_quantization.py (q8 and q4
error within half a step, 60 examples each); they are not repeated here.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memories import crypto
from memories.models import Memory
from memories.selectors import MemoryIntegrityError, memory_open
from memories.services import memory_append

pytestmark = pytest.mark.django_db

# Any Unicode text the service accepts: no surrogates (not encodable), no NUL, not only whitespace.
texts = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=300
).filter(lambda t: t.strip())
keys = st.binary(min_size=32, max_size=32)
aads = st.binary(max_size=64)
HYPOTHESIS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@HYPOTHESIS
@given(key=keys, plaintext=st.binary(max_size=2048), aad=aads)
def test_seal_then_unseal_returns_the_plaintext(key, plaintext, aad):
    nonce, ciphertext = crypto.seal(key, plaintext, aad=aad)
    assert crypto.unseal(key, nonce, ciphertext, aad=aad) == plaintext
    assert len(ciphertext) == len(plaintext) + 16  # the GCM tag, and nothing of the plaintext in clear
    if len(plaintext) >= 8:
        assert plaintext not in ciphertext


@HYPOTHESIS
@given(key=keys, plaintext=st.binary(min_size=1, max_size=512), aad=aads, data=st.data())
def test_any_flipped_bit_or_other_aad_fails_to_open(key, plaintext, aad, data):
    nonce, ciphertext = crypto.seal(key, plaintext, aad=aad)
    position = data.draw(st.integers(0, len(nonce) + len(ciphertext) - 1))
    bit = 1 << data.draw(st.integers(0, 7))
    blob = bytearray(nonce + ciphertext)
    blob[position] ^= bit
    with pytest.raises(crypto.InvalidTag):
        crypto.unseal(key, bytes(blob[:12]), bytes(blob[12:]), aad=aad)
    with pytest.raises(crypto.InvalidTag):
        crypto.unseal(key, nonce, ciphertext, aad=aad + b"x")


@HYPOTHESIS
@given(text=texts, subject=st.one_of(st.none(), st.sampled_from(["dana", "erin", "frank"])))
def test_any_accepted_text_round_trips_through_the_log(scope_a, text, subject):
    memory = memory_append(scope=scope_a, subject=subject, content=text)
    row = Memory.objects.select_related("scope__key", "subject").get(pk=memory.pk)
    if len(text.encode()) >= 8:  # a byte or two can occur in random ciphertext by chance; eight cannot (2^-64)
        assert text.encode() not in bytes(row.ciphertext)
    opened = memory_open(memory=row)
    assert opened.text == text and not opened.erased and opened.subject == subject


@HYPOTHESIS
@given(first=texts, second=texts)
def test_a_ciphertext_moved_to_another_row_never_opens(scope_a, first, second):
    a = memory_append(scope=scope_a, subject="dana", content=first)
    b = memory_append(scope=scope_a, subject="dana", content=second)
    # the same subject key seals both: only the associated data (the row's seq) tells them apart
    moved = Memory.objects.select_related("scope__key", "subject").get(pk=b.pk)
    moved.nonce, moved.ciphertext = a.nonce, a.ciphertext
    with pytest.raises(MemoryIntegrityError):
        memory_open(memory=moved)
