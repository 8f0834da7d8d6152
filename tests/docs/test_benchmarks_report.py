"""BENCHMARKS.md is what bench/report.py writes from bench/results/ and the templates in bench/report/."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_report", ROOT / "bench" / "report.py")
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


def test_benchmarks_md_is_generated_from_the_results():
    assert (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8") == report.report(), (
        "BENCHMARKS.md is not up to date: run .venv/bin/python bench/report.py"
    )


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({
        "started_at": "2026-12-01T00:00:00Z", "ok": True,
        "rows": [{"n": 1, "s": 0.5}, {"n": 2, "s": 0.25}], "by": {"a": {"x": 1}, "b": {"x": 2}},
    }))
    return tmp_path


def test_a_rows_directive_repeats_its_line_per_element_and_fills_inline_values(results):
    template = ("Measured {{ run.json | {started_at} }}: {{ run.json | {ok} }}\n"
                "<!-- rows run.json[rows] -->\n| {n} | {s:.2f} | {= 1 / s :.0f} |\n"
                "<!-- rows run.json[by][*] -->\n| {_key} | {x} |\n")
    assert report.render(template, "t.md") == (
        "Measured 2026-12-01T00:00:00Z: yes\n| 1 | 0.50 | 2 |\n| 2 | 0.25 | 4 |\n| a | 1 |\n| b | 2 |\n"
    )


def test_a_missing_key_or_file_stops_the_report_naming_it(results):
    with pytest.raises(ValueError, match=r"run.json\[rows\]\[0\].*no key 'missing'"):
        report.render("<!-- rows run.json[rows] -->\n| {missing} |\n", "t.md")
    with pytest.raises(FileNotFoundError, match="gone.json"):
        report.render("{{ gone.json | {x} }}\n", "t.md")


def test_an_expression_has_min_and_max_and_no_other_builtin(results):
    assert report.render("{{ run.json | {= min(r['s'] for r in rows)}-{= max(r['n'] for r in rows)} }}\n", "t.md") == "0.25-2\n"
    with pytest.raises(ValueError, match="name 'open' is not defined"):
        report.render("{{ run.json | {= open('/etc/passwd')} }}\n", "t.md")
