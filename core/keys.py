"""Master keys in configuration: their parsing (settings.py and the dev key file use the same rules) and the error
raised when a stored key names one this process does not know (core renders it; memories raises it)."""
from __future__ import annotations

import base64
import binascii

from django.core.exceptions import ImproperlyConfigured


class MasterKeyUnavailable(ImproperlyConfigured):
    """A wrapped key names a master key that is not configured (a request that meets it is a JSON 503)."""


def parse_master_key(raw: str, *, name: str) -> bytes:
    """Decode a base64 (urlsafe or standard) 32-byte AES-256 master key."""
    try:
        key = base64.urlsafe_b64decode(raw.replace("+", "-").replace("/", "_") + "=" * (-len(raw) % 4))
    except (binascii.Error, ValueError):
        raise ImproperlyConfigured(f"`{name}` has to be 32 bytes encoded as base64 but is not valid base64") from None
    if len(key) != 32:
        raise ImproperlyConfigured(f"`{name}` has to decode to 32 bytes (AES-256) but decodes to {len(key)}")
    return key
