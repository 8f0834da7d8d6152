"""ASGI entry point: what the production web server runs (``bin/serve``: gunicorn managing uvicorn workers).

ASGI rather than WSGI so that a response can stream (server-sent events on ``/ask/``) without holding a
thread per open stream. Sync views still run, in the worker's thread pool, one request at a time per worker
process (Django runs them thread-sensitive); concurrency comes from the number of worker processes
(``MNESIO_WEB_WORKERS``). Static files are served by WhiteNoise's middleware (mnesio_site/settings.py) from
``STATIC_ROOT``, which ``bin/serve`` fills with ``collectstatic`` before it starts.
"""
from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mnesio_site.settings")
application = get_asgi_application()
