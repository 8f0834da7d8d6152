"""bench/results/ holds only results the docs cite, and no scripts (those live in bench/).

A tracked file there is cited when a document (README.md, BENCHMARKS.md, docs/**/*.md, or a section template of
bench/report/, whose directives name what bench/report.py reads by its path under bench/results/) names it: by its
path from the repository root or from bench/results/, by its file name when no other results file has that name, or
by ``bench/results/<folder>`` for a folder that holds it. ``a{b,c}d`` in a document names ``abd`` and ``acd``.
Superseded results leave the folder; git keeps them.
"""
from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]
RESULTS = "bench/results"
DOCUMENTS = ("README.md", "BENCHMARKS.md", "docs/**/*.md", "bench/report/*.md")
SCRIPT_SUFFIXES = {".py", ".sh", ".ipynb"}
BRACES = re.compile(r"([\w.\-/]*)\{([\w.\-]+(?:,[\w.\-]+)+)\}([\w.\-/]*)")
# a name that goes on past a match is another name (kveval vs kveval-q4, x.json vs x.json.bak); a full stop is not
GOES_ON = r"(?![\w\-]|\.\w)"


def _expanded(text: str) -> str:
    """``text`` with every ``a{b,c}d`` written out as ``abd acd``."""
    while (found := BRACES.search(text)):
        prefix, options, suffix = found.groups()
        text = text[:found.start()] + " ".join(prefix + o + suffix for o in options.split(",")) + text[found.end():]
    return text


def _names(text: str, name: str, *, alone: bool) -> bool:
    """Whether ``text`` names ``name`` whole after ``bench/results/`` or, when ``alone``, standing alone too."""
    start = rf"(?:{re.escape(RESULTS)}/|(?<![\w.\-/]))" if alone else rf"{re.escape(RESULTS)}/"
    return re.search(start + re.escape(name) + GOES_ON, text) is not None


def uncited(files: list[str], documents: list[str]) -> list[str]:
    """The results files (paths under bench/results/) that none of ``documents`` (their texts) cites."""
    text = "\n".join(_expanded(document) for document in documents)
    file_names = Counter(PurePosixPath(f).name for f in files)
    missing = []
    for path in files:
        relative = PurePosixPath(path).relative_to(RESULTS)
        folders = [str(parent) for parent in relative.parents if str(parent) != "."]
        cited = (_names(text, str(relative), alone=True)
                 or (file_names[relative.name] == 1 and _names(text, relative.name, alone=True))
                 or any(_names(text, folder, alone=False) for folder in folders))
        if not cited:
            missing.append(path)
    return missing


def _tracked_results() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--", RESULTS], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


def _documents() -> list[str]:
    return [p.read_text(encoding="utf-8") for pattern in DOCUMENTS for p in sorted(ROOT.glob(pattern))]


def test_every_results_file_is_cited_by_a_document_or_the_report():
    missing = uncited(_tracked_results(), _documents())
    assert not missing, f"results no document cites (cite them, or git rm them; git keeps them): {missing}"


def test_no_script_lives_among_the_results():
    scripts = [f for f in _tracked_results() if PurePosixPath(f).suffix in SCRIPT_SUFFIXES]
    assert not scripts, f"scripts belong in bench/, not bench/results/: {scripts}"


def test_the_rule_tells_a_cited_file_from_an_uncited_one():
    files = [f"{RESULTS}/{name}" for name in (
        "speed.json", "speed-old.json", "kveval/results.json", "kveval/curve.png", "kveval-q4/results.json",
        "kveval-q4/tune.json", "runs/a-1.json", "runs/a-2.json", "old/results.json", "stale.json")]
    documents = [
        "Raw file: speed.json. Charts: `bench/results/kveval/`.",  # a name alone before a full stop, and a folder
        "<!-- rows kveval-q4/results.json -->\n| {x} |",  # a report directive
        "`tune.json` (unique name); `bench/results/runs/a-{1,2}.json`; stale.json.bak; `results.json` is ambiguous",
    ]
    assert uncited(files, documents) == [f"{RESULTS}/speed-old.json", f"{RESULTS}/old/results.json",
                                         f"{RESULTS}/stale.json"]
    # a folder named alone is a word, not a citation: "kveval" would cite every run of the evaluator
    assert uncited([f"{RESULTS}/kveval/curve.png"], ["the kveval package"]) == [f"{RESULTS}/kveval/curve.png"]
    # a planted file in a copy of the real results is caught
    planted = f"{RESULTS}/planted-by-the-test.json"
    assert uncited([*_tracked_results(), planted], _documents()) == [planted]
