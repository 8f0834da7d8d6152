"""What the isolation tests (tests/reliability/test_isolation*.py) share: the marker that must never reach a foreign
client, a valid body per POST route, and permissions by their dotted name."""
from __future__ import annotations

MARKER = "zebra-quokka-7731"  # a unique plaintext that must never reach a foreign client

# A valid body per POST route: the refusal must come from the scope check, not from validation.
BODIES = {
    "scope-memories": {"content": "a new fact"},
    "erasure-requests": {"subject": "dana", "reason": "asked to be forgotten"},
    "cartridge-compile": {},
    "cartridge-rollback": {},
    "cartridge-evaluate": {},
    "cartridge-activate": {},
    "scope-ask": {"question": "Where is the spare key?"},
    "evaluation-cases": {"question": "Where is the spare key?", "answers": ["flowerpot"]},
    "scope-search": {"query": "spare key"},
    "scope-grants": {"user": "charlie"},
    "scope-settings": {"auto_refresh": "on_append"},
}


def perm(dotted: str):
    """The Permission named ``app_label.codename``."""
    from django.contrib.auth.models import Permission

    app_label, codename = dotted.split(".")
    return Permission.objects.get(content_type__app_label=app_label, codename=codename)
