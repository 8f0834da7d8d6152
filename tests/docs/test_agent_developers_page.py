"""Every python example of docs/agent-developers.md, run as a script (its own process, as a reader runs it) against
a live uvicorn server with the fake engine, given the MNESIO_URL, MNESIO_TOKEN and MNESIO_SCOPE the page names."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import token_for

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "agent-developers.md"
FACTS = ["Lena's dog is called Pixel.", "The spare key is under the blue flowerpot."]


def examples() -> dict[str, str]:
    """The page's python blocks by the heading they stand under."""
    found: dict[str, str] = {}
    for section in re.split(r"^## ", PAGE.read_text(encoding="utf-8"), flags=re.MULTILINE)[1:]:
        heading = section.splitlines()[0].strip()
        for i, block in enumerate(re.findall(r"^```python\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)):
            found[heading if i == 0 else f"{heading} {i + 1}"] = block
    return found


EXAMPLES = examples()


def test_it_has_an_example_for_each_client():
    assert list(EXAMPLES) == ["The mnesio client", "The openai client", "LangChain", "LlamaIndex", "MCP"]
    for block in EXAMPLES.values():
        assert all(f'"{name}"' in block or f"'{name}'" in block for name in ("MNESIO_URL", "MNESIO_TOKEN")), block


@pytest.mark.parametrize("heading", list(EXAMPLES))
def test_its_example_runs_and_prints_the_answer(heading, alice, scope_a, served, asgi_server):
    served(scope_a, FACTS)
    env = {**os.environ, "MNESIO_URL": asgi_server.url, "MNESIO_TOKEN": token_for(alice), "MNESIO_SCOPE": "scope-a",
           "PYTHONPATH": str(ROOT / "clients" / "python")}  # what `pip install ./clients/python` makes importable
    done = subprocess.run([sys.executable, "-c", EXAMPLES[heading]], env=env, cwd="/tmp", capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == FACTS[0], done.stdout  # the streamed answer (the fake engine answers with the best memory)
    if heading == "The mnesio client":
        assert "refused: invalid_input {'top_k'" in done.stdout
    if heading == "MCP":
        assert lines[0] == "tools: ['ask', 'forget', 'list_scopes', 'recall', 'remember']"
