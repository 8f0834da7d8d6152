"""What the isolation tests (tests/reliability/test_isolation*.py) share: the marker that must never reach a foreign
client, and permissions by their dotted name."""
from __future__ import annotations

MARKER = "zebra-quokka-7731"  # a unique plaintext that must never reach a foreign client


def perm(dotted: str):
    """The Permission named ``app_label.codename``."""
    from django.contrib.auth.models import Permission

    app_label, codename = dotted.split(".")
    return Permission.objects.get(content_type__app_label=app_label, codename=codename)
