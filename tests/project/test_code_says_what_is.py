"""Code says what is: module docstrings stay short (the long text is a design page), and no code, test or design
page cites an issue number or narrates cartridge format history (git keeps the history)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "memories", "cartridges", "kvengine", "mnesio_site", "bench")
MAX_DOCSTRING_LINES = 20  # the aim is ~15 lines and a link to docs/design/<topic>.md
# the word issue (or issues) and a tracker's number, with or without '#': it means nothing to a reader of the code
ISSUE_NUMBER = re.compile(r"\bissues?\s*#?\s*\d+", re.IGNORECASE)
# "format 6's q4", "since format 5", "(format 7)", "before format 4": the file format's past versions
FORMAT_HISTORY = re.compile(r"\b(?:(?:since|before|until|as of)\s+)?format[ -]\d+\b", re.IGNORECASE)


def _python_files(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (ROOT / top).rglob("*.py") if "migrations" not in p.parts)


def _long_docstrings(source: str, limit: int = MAX_DOCSTRING_LINES) -> int | None:
    """The module docstring's line count when it is over ``limit``, else None."""
    docstring = ast.get_docstring(ast.parse(source), clean=False)
    lines = len(docstring.splitlines()) if docstring else 0
    return lines if lines > limit else None


def _citations(text: str) -> list[str]:
    """The issue numbers and format-history phrases in ``text``."""
    return [m.group(0).strip() for pattern in (ISSUE_NUMBER, FORMAT_HISTORY) for m in pattern.finditer(text)]


def test_the_checks_catch_what_they_look_for():
    long_module = '"""Title.\n' + "more text\n" * 25 + '"""\nx = 1\n'
    assert _long_docstrings(long_module) == 26
    assert _long_docstrings('"""Title.\n\nA short module."""\n') is None
    cited = ("issue", 14, 3)  # the sample is built, so this file does not cite a number itself
    assert _citations(f"# the fix for {cited[0]} {cited[1]} (see {cited[0]} #{cited[2]})") == [
        f"{cited[0]} {cited[1]}", f"{cited[0]} #{cited[2]}"]
    assert _citations("# since format 6 q4's keys get 5 bits; format-5 layout") == ["since format 6", "format-5"]
    assert _citations("# the format version is checked; a format string; 8 issues remain") == []


def test_every_module_docstring_fits_in_a_few_lines():
    too_long = {str(p.relative_to(ROOT)): n for p in _python_files(*PACKAGES) if (n := _long_docstrings(p.read_text()))}
    assert not too_long, f"module docstrings over {MAX_DOCSTRING_LINES} lines (move the substance to docs/design/): {too_long}"


def test_no_code_test_or_design_page_cites_an_issue_or_a_format_history():
    files = [p for p in _python_files(*PACKAGES, "tests", "clients") if p != Path(__file__).resolve()]
    files += sorted((ROOT / "docs" / "design").glob("*.md"))
    found = {str(p.relative_to(ROOT)): hits for p in files if (hits := _citations(p.read_text()))}
    assert not found, f"say what the code does, not its history: {found}"
