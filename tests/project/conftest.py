"""The settings loader of test_settings_environment.py, shared with the other settings tests of this folder."""
from __future__ import annotations

from .test_settings_environment import load  # noqa: F401 - the fixture: settings.py run with only the given variables
