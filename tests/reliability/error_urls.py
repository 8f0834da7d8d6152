"""A URLconf for tests/reliability/test_error_pages.py: views that fail with key material and plaintext in scope."""
from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

PLAINTEXT = "Gideon's vault combination is 31-07-1990 heron-lantern"


@csrf_exempt
def failing_decryption(request: HttpRequest) -> HttpResponse:
    """Seal a memory and open it with the wrong associated data: InvalidTag inside crypto.unseal."""
    from memories import crypto

    master = crypto.master_key()  # noqa: F841 (a local the error page must not show)
    data_key = crypto.new_data_key()
    plaintext = PLAINTEXT.encode()
    wrapped, _ = crypto.wrap(data_key, aad=b"test-key")
    nonce, sealed = crypto.seal(data_key, plaintext, aad=b"right")
    crypto.unseal(data_key, nonce, sealed, aad=b"wrong")
    return HttpResponse("unreachable")


@csrf_exempt
def failing_after_open(request: HttpRequest) -> HttpResponse:
    """Open real memories through the selector, then fail with the texts in scope."""
    from memories.models import Memory
    from memories.selectors import memories_open

    opened = memories_open(Memory.objects.select_related("scope__key", "subject").order_by("seq"))
    texts = [m.text for m in opened]
    raise RuntimeError(f"failed after opening {len(texts)} memories")


urlpatterns = [
    path("fail/decrypt/", failing_decryption),
    path("fail/open/", failing_after_open),
]
