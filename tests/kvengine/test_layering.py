"""kvengine is the engine: importing any of its modules never imports Django, DRF or Celery."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "kvengine"
FRAMEWORKS = ("django", "rest_framework", "celery")


def test_no_engine_module_imports_django_drf_or_celery():
    modules = sorted(
        ".".join(path.relative_to(ENGINE.parent).with_suffix("").parts).removesuffix(".__init__")
        for path in ENGINE.rglob("*.py")
        if path.name != "__main__.py"
    )
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ENGINE.parent)
    assert "kvengine.retrieval" in modules and "kvengine.layout" in modules
    assert out.stdout.strip() == "[]"


def test_the_gates_text_baselines_do_not_import_torch():
    # the Django process imports these for the gate; the fake-backend configuration must stay torch-free
    code = "import sys, kvengine.retrieval, kvengine.text, kvengine.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ENGINE.parent)
    assert out.stdout.strip() == "False"
