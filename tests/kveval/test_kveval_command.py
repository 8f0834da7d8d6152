"""`python manage.py kveval` end to end on the fake engine: the eval report plus the erasure check."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from cartridges.models import CartridgeVersion
from memories.models import Scope
from tests.cartridges.conftest import blob_root, fake_engine  # noqa: F401

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "squad_subset" / "squad_v1.1_dev_subset.json"

# The fake backend as the active configuration, blobs in a temp dir: the cartridges tests' fixtures. The command
# loads cartridges into this process's LRU; tests/conftest.py's fresh_engine empties it after each test, or every
# later request would run the purge queries (tests/memories/test_api.py pins its query count).
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fake_engine")]


def _run(out: Path, *extra: str) -> None:
    call_command("kveval", "--backend", "fake", "--squad-file", str(FIXTURE), "--budgets", "300,600",
                 "--questions", "4", "--articles", "1", "--erasure-budget", "600", "--out", str(out),
                 "--no-progress", *extra, stdout=io.StringIO())


def test_it_erases_a_paragraph_and_rebuilds_the_never_stored_blob(tmp_path):
    _run(tmp_path / "out")
    erasure = json.loads((tmp_path / "out" / "erasure.json").read_text())
    assert erasure["checks"] == {
        "old_version_destroyed": True, "erased_memory_left_out": True, "rebuilt_blob_equals_never_stored": True,
        "answers_equal_never_stored": True, "no_better_than_never_stored": True, "holds": True,
    }
    assert erasure["blob_sha256"]["rebuilt"] == erasure["blob_sha256"]["never_stored"] != erasure["blob_sha256"]["before"]
    # the fake answers with the best-matching memory: before erasure that is the erased paragraph itself
    assert erasure["figures"]["before"]["f1"] > erasure["figures"]["after"]["f1"]
    scope = Scope.objects.get(name=erasure["scope"])
    assert scope.memories.count() == erasure["num_paragraphs"]
    never = Scope.objects.get(name=erasure["never_stored_scope"])
    assert never.memories.count() == erasure["num_paragraphs"] - 1
    assert CartridgeVersion.objects.filter(scope=scope).count() == 2  # before and rebuilt
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["erasure"]["checks"]["holds"] is True
    assert [b["budget"] for b in results["budgets"]] == [300, 600]
    assert "Erasure check" in (tmp_path / "out" / "results.md").read_text()


def test_it_runs_the_erasure_check_alone(tmp_path):
    _run(tmp_path / "out", "--skip-engine")
    assert (tmp_path / "out" / "erasure.md").read_text().count("**yes**") == 5
    assert not (tmp_path / "out" / "results.json").exists()


def test_it_refuses_skipping_everything_and_a_missing_squad_file(tmp_path):
    with pytest.raises(CommandError, match="nothing to run"):
        _run(tmp_path, "--skip-engine", "--skip-erasure")
    with pytest.raises(CommandError, match="--squad-file"):
        call_command("kveval", "--squad-file", str(tmp_path / "missing.json"), "--skip-engine")


def test_it_runs_locomo_through_the_engine_part_only(tmp_path, locomo_file):
    call_command("kveval", "--dataset", "locomo", "--locomo-file", str(locomo_file), "--backend", "fake",
                 "--modes", "bm25", "--retrievers", "bm25", "--categories", "4", "--out", str(tmp_path / "out"),
                 "--no-progress", stdout=io.StringIO())
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["dataset"] == "locomo" and results["command"].startswith("python manage.py kveval")
    assert {r["category"] for r in results["records"]} == {4} and len(results["records"]) == 3
    assert not (tmp_path / "out" / "erasure.json").exists()
    assert not Scope.objects.filter(name__startswith="kveval-").exists()  # nothing stored
    with pytest.raises(CommandError, match="`--locomo-file`"):
        call_command("kveval", "--dataset", "locomo", "--locomo-file", str(tmp_path / "missing.json"))
