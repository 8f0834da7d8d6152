"""A question's path (the ask view to the answer) and a memory's path (the append view to the activated cartridge)
enter each project file once: no call stack goes from a file into another project file and back (A -> B -> A).

The paths run for real (fake engine; the refresh as the embedded default runs it, the debounce timer's work run
in the test's thread) under a profiler that looks at the stack at every call into a project file:
only project frames count (files under the checkout, outside tests/ and the virtualenv), and consecutive project
frames of one file are one step, also when Django or DRF frames lie between them (a view that DRF hands back to
a serializer of the view's own module). A stack is one thread's: a thread the path starts is profiled too
(threading.setprofile), from its own start. docs/architecture.md ("How the paths are checked") says the same.
"""
from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the folder's conftest: blobs in a temp dir, the fake engine
NOT_PROJECT = {"tests", ".venv", "venv", "site-packages", "node_modules"}

Step = tuple[str, tuple[str, ...]]  # a project file (relative to the root) and the functions of it on the stack, outer first


class BackAndForth:
    """A profile function: every chain of project files that goes back to a file it has left, once each."""

    def __init__(self, root: Path) -> None:
        self.root = str(root.resolve()) + os.sep
        self._files: dict[str, str | None] = {}
        self.chains: dict[tuple[Step, ...], None] = {}  # a dict for its order; no two alike
        self.files: set[str] = set()  # every project file called into

    def project_file(self, filename: str) -> str | None:
        """``filename`` relative to the root when it is a project source file, else None (cached)."""
        try:
            return self._files[filename]
        except KeyError:
            path = os.path.realpath(filename) if os.path.isabs(filename) else ""  # not "<frozen ...>" nor "<string>"
            relative = path[len(self.root):] if path.startswith(self.root) else None
            if relative is not None and NOT_PROJECT.intersection(Path(relative).parts):
                relative = None
            self._files[filename] = relative
            return relative

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        # Each stack arises from a call into its innermost frame, so a chain is found when it closes: at the call
        # that enters a file already on the stack further out.
        if event != "call":
            return
        called = self.project_file(frame.f_code.co_filename)
        if called is None:
            return
        self.files.add(called)
        steps: list[tuple[str, list[str]]] = []  # innermost first, consecutive frames of one file collapsed
        f: FrameType | None = frame
        while f is not None:
            name = self.project_file(f.f_code.co_filename)
            if name is not None:
                if steps and steps[-1][0] == name:
                    steps[-1][1].append(f.f_code.co_name)
                else:
                    steps.append((name, [f.f_code.co_name]))
            f = f.f_back
        innermost = steps[0][0]
        for i in range(1, len(steps)):
            if steps[i][0] == innermost:
                # the file gone back to is named by the function that re-entered it: what it calls next within
                # itself is the same chain
                steps[0] = (innermost, steps[0][1][-1:])
                chain = tuple((name, tuple(reversed(functions))) for name, functions in reversed(steps[: i + 1]))
                self.chains.setdefault(chain, None)
                return

    def report(self) -> str:
        """One line per chain: ``file:outer/inner -> file:function -> ...``."""
        return "\n".join(" -> ".join(f"{name}:{'/'.join(functions)}" for name, functions in chain) for chain in self.chains)


@contextmanager
def back_and_forth(root: Path = ROOT) -> Iterator[BackAndForth]:
    """Profile the block, in this thread and in every thread started within it."""
    recorder = BackAndForth(root)
    before, before_threads = sys.getprofile(), threading.getprofile()
    threading.setprofile(recorder)
    sys.setprofile(recorder)
    try:
        yield recorder
    finally:
        sys.setprofile(before)
        threading.setprofile(before_threads)


def _assert_no_back_and_forth(run: Callable[[], None], what: str, *, reaches: tuple[str, ...]) -> None:
    """Run ``run`` profiled; it has to call into each file of ``reaches`` (the profiler saw the path: no part of
    it went to a thread started before) and go back to no file it has left."""
    with back_and_forth() as recorder:
        run()
    missed = sorted(set(reaches) - recorder.files)
    assert not missed, f"{what} never called into {missed}: a thread started before the profiler ran it, or it moved"
    assert not recorder.chains, f"{what} goes back to a file it has left ({len(recorder.chains)} chains):\n{recorder.report()}"


@pytest.mark.django_db
def test_a_questions_path_enters_each_file_once(alice, scope_a, append, api_client_for):
    from cartridges.services import cartridge_activate, cartridge_compile

    append(scope_a, "The spare key is under the blue flowerpot.")
    cartridge_activate(version=cartridge_compile(scope=scope_a))
    client = api_client_for(alice)

    def ask() -> None:
        response = client.post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?"}, format="json")
        assert response.status_code == 200, response.content
        assert response.json()["mode"] == "cartridge"

    _assert_no_back_and_forth(ask, "POST /api/v1/scopes/<scope>/ask/",
                              reaches=("cartridges/api/views.py", "cartridges/asking.py", "kvengine/fake.py"))


# a real commit: the append hooks run after it, inside the request, as they do in production
@pytest.mark.django_db(transaction=True)
def test_a_memorys_path_enters_each_file_once(alice, scope_a, api_client_for, eager_tasks):
    from cartridges.selectors import active_version
    from cartridges.services import scope_settings_update
    from cartridges.services.refresh import refresh_timers_flush

    scope_settings_update(scope=scope_a, auto_refresh="on_append", auto_refresh_debounce_s=60)
    client = api_client_for(alice)

    def append_and_refresh() -> None:
        response = client.post("/api/v1/scopes/scope-a/memories/", {"content": "Ada drinks green tea."}, format="json")
        assert response.status_code == 201, response.content
        assert refresh_timers_flush() == [scope_a.pk]  # the debounced refresh the append scheduled, run now

    _assert_no_back_and_forth(append_and_refresh, "POST /api/v1/scopes/<scope>/memories/ and its refresh", reaches=(
        "memories/api/views.py", "memories/services/appends.py", "memories/registry.py", "cartridges/tasks.py",
        "cartridges/services/refresh.py", "cartridges/services/compile.py", "cartridges/services/activate.py",
    ))
    assert active_version(scope=scope_a).log_head == 1


def test_it_names_each_chain_that_goes_back_to_a_file(tmp_path, monkeypatch):
    (tmp_path / "paths_a.py").write_text(
        "import paths_b\n\ndef start():\n    paths_b.middle()\n\ndef callback():\n    return 1\n"
    )
    (tmp_path / "paths_b.py").write_text("import paths_a\n\ndef middle():\n    paths_a.callback()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import paths_a

    with back_and_forth(tmp_path) as recorder:
        paths_a.start()
        paths_a.callback()  # on its own: no chain
    assert recorder.report() == "paths_a.py:start -> paths_b.py:middle -> paths_a.py:callback"
