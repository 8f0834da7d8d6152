"""Write docs/configuration.md from the declaration of every variable (core/settings_spec.py).

    .venv/bin/python -m core.settings_doc > docs/configuration.md

Needs no database, no configured Django and no model; tests/docs checks that the committed page is what this
prints now.
"""
from __future__ import annotations

import sys
from pathlib import Path

from .settings_spec import BOOL_STRINGS, DECLARED, SECTIONS, SETTINGS_PY, Setting

COMMAND = ".venv/bin/python -m core.settings_doc > docs/configuration.md"
TYPES = {"text": "text", "secret": "secret", "bool": "boolean", "int": "integer", "float": "number",
         "choice": "choice", "list": "list", "path": "path"}
INTRO = f"""# Configuration

Every setting is an environment variable, read when a process starts. This page lists each one the project reads,
with its type, default and the values it accepts. It is generated from their one declaration in
`core/settings_spec.py`: edit that, then run `{COMMAND}`.

- An unset or empty variable means its default.
- A bad value stops the process at start with `ImproperlyConfigured`, naming the variable, what it accepts and
  what it got.
- **boolean**: one of {", ".join(f"`{v}`" for v in BOOL_STRINGS)} (any case).
- **list**: comma-separated; blanks around and between the commas are dropped.
- **secret**: the value itself, or the name of a file holding it in `NAME_FILE` (Docker and Kubernetes secrets),
  e.g. `MNESIO_MASTER_KEY_FILE=/run/secrets/master_key`.
- The embedded default needs nothing set but `MNESIO_DEBUG=true` (what `bin/run` does); a deployment sets at least
  `SECRET_KEY`, `MNESIO_MASTER_KEY`, `DATABASE_URL` and `REDIS_URL`.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default(setting: Setting) -> str:
    if setting.default_doc:
        return _cell(setting.default_doc)
    value = setting.default
    if value is None or value == "" or value == ():
        return "(empty)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return f"`{','.join(value)}`"
    return f"`{value}`"


def _accepts(setting: Setting) -> str:
    if setting.choices:
        return ", ".join(f"`{c}`" for c in setting.choices)
    return _cell(setting.bounds)


def _help(setting: Setting) -> str:
    reader = "" if setting.read_by == SETTINGS_PY else f" Read by `{setting.read_by}`."
    return _cell(setting.help + reader)


def render() -> str:
    """The whole page, as Markdown."""
    parts = [INTRO]
    for section in SECTIONS:
        parts.append(f"\n## {section}\n\n| Variable | Type | Default | Accepts | What it does |\n|---|---|---|---|---|\n")
        for setting in (s for s in DECLARED if s.section == section):
            parts.append(f"| `{setting.name}` | {TYPES[setting.kind]} | {_default(setting)} | {_accepts(setting)} "
                         f"| {_help(setting)} |\n")
    return "".join(parts)


PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"

if __name__ == "__main__":
    sys.stdout.write(render())
