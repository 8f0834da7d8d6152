"""A URLconf with one streaming view that logs while its body is produced (tests/reliability/test_observability.py)."""
from __future__ import annotations

import logging

from django.http import StreamingHttpResponse
from django.urls import path


def _chunks():
    for i in range(3):
        logging.getLogger("mnesio").info("streamed chunk %d", i)
        yield f"data: {i}\n\n"


def stream(request):
    return StreamingHttpResponse(_chunks(), content_type="text/event-stream")


urlpatterns = [path("stream/", stream, name="test-stream")]
