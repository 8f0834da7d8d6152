"""Every error body carries a stable top-level ``code`` (core.errors.ERROR_CODES): each documented code is produced
by a real request here (or by a named test elsewhere that asserts it), each error class of every app maps to a
documented code, and the schema's ``Error`` component lists exactly the documented codes."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from core.errors import ERROR_CODES, Conflict, MnesioError, error_code, exception_handler
from tests.support.blobs import tamper

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
KEY = "The spare key is under the blue flowerpot."
MEMORIES = "/api/v1/scopes/scope-a/memories/"

# Codes produced by scenarios that need a harness of their own: the test that produces and asserts each.
ELSEWHERE = {
    "database_unavailable": "tests/reliability/test_database_faults.py",
    "master_key_unavailable": "tests/cartridges/test_master_key_mistakes.py",
    "context_too_long": "tests/api/test_error_statuses.py",
    "already_erased": "tests/memories/test_forget_memory.py",
    "worker_timeout": "tests/serving/test_async_and_backpressure.py",
    "version_pruned": "tests/api/test_cartridge_versions.py",
    "too_many_pending_asks": "tests/reliability/test_async_flood.py",
    "body_too_large": "tests/api/test_body_limits.py",
    "too_many_sessions": "tests/serving/test_mcp.py",
}
# The catch-all: never produced on purpose (an error class without a code of its own and an unlisted status).
CATCH_ALL = {"error"}


def _scenarios():
    """code -> a function(client_for, world) returning the response that should carry it."""

    def invalid_input(c, w):
        return c(w.alice).post(MEMORIES, {"contnet": "typo"}, format="json")

    def not_authenticated(c, w):
        from rest_framework.test import APIClient

        return APIClient().get("/api/v1/scopes/")

    def authentication_failed(c, w):
        from rest_framework.test import APIClient

        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION="Token " + "0" * 64)
        return client.get("/api/v1/scopes/")

    def permission_denied(c, w):
        return c(w.alice).post("/api/v1/kv/configuration/", {"backend": "fake", "model": "fake-model", "dtype": "f32",
                                                          "quant": "none"}, format="json")

    def not_found(c, w):
        return c(w.alice).get("/api/v1/scopes/scope-c/head/")

    def method_not_allowed(c, w):
        return c(w.alice).get("/api/v1/scopes/scope-a/ask/")

    def not_acceptable(c, w):
        return c(w.alice).get("/api/v1/scopes/", HTTP_ACCEPT="application/xml")

    def unsupported_media_type(c, w):
        return c(w.alice).post(MEMORIES, data="content=hello", content_type="text/plain")

    def conflict(c, w):
        c(w.alice).post(MEMORIES, {"content": "first", "idempotency_key": "k-1"}, format="json")
        return c(w.alice).post(MEMORIES, {"content": "other", "idempotency_key": "k-1"}, format="json")

    def nothing_to_compile(c, w):
        return c(w.alice).post("/api/v1/scopes/scope-a/cartridges/compile/", {}, format="json")

    def no_active_cartridge(c, w):  # a scope with no memories: nothing to compile in memory either
        return c(w.alice).post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?"}, format="json")

    def gate_failed(c, w):
        from cartridges.services import cartridge_compile

        w.append(w.scope_a, KEY)
        version = cartridge_compile(scope=w.scope_a)
        tamper(version)
        return c(w.alice).post(f"/api/v1/scopes/scope-a/cartridges/{version.pk}/activate/", {}, format="json")

    def _serving(w):
        from cartridges import engine

        version = w.served(w.scope_a, [KEY])
        engine.cache_clear()  # a cold process: the next answer reads the blob
        return version

    def blob_unavailable(c, w):
        from cartridges.storage import blob_storage

        blob_storage().delete(_serving(w).storage_name)
        return c(w.alice).post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?"}, format="json")

    def blob_tampered(c, w):
        tamper(_serving(w))
        return c(w.alice).post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?"}, format="json")

    def blob_storage_unavailable(c, w):
        w.append(w.scope_a, KEY)
        a_file = w.tmp_path / "a-file"
        a_file.write_text("not a directory")
        w.settings.STORAGES = {**w.settings.STORAGES, "cartridges": {
            "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(a_file / "blobs")}}}
        return c(w.alice).post("/api/v1/scopes/scope-a/cartridges/compile/", {}, format="json")

    def memory_integrity(c, w):
        from memories.models import Memory

        original = w.append(w.scope_a, KEY)
        Memory.objects.create(seq=original.seq + 1, scope=w.scope_a, nonce=original.nonce,
                              ciphertext=original.ciphertext)  # a row forged from another's sealed bytes
        return c(w.alice).get(f"{MEMORIES}{original.seq + 1}/")

    def legacy_subject_needs_operator(c, w):
        from memories import crypto
        from memories.models import Memory, Subject

        # a subject filed before subjects were per scope (no scope), with a memory in scope A and one in scope C
        data_key = crypto.new_data_key()
        wrapped, kid = crypto.wrap(data_key, aad=crypto.subject_key_aad("eve"))
        legacy = Subject.objects.create(external_id="eve", wrapped_key=wrapped, wrapped_by=kid)
        for scope, text in ((w.scope_a, "eve in A"), (w.scope_c, "eve in C")):
            seq = w.append(scope, "placeholder").seq + 1000
            nonce, ciphertext = crypto.seal(
                data_key, text.encode(), aad=crypto.memory_aad(seq=seq, scope_id=scope.pk, subject_id=legacy.pk))
            Memory.objects.create(seq=seq, scope=scope, subject=legacy, nonce=nonce, ciphertext=ciphertext)
        return c(w.alice).post("/api/v1/scopes/scope-a/erasure-requests/", {"subject": "eve", "reason": "asked"},
                               format="json")

    return {name: fn for name, fn in locals().items() if not name.startswith("_") and name in ERROR_CODES}


SCENARIOS = _scenarios()


class World:
    def __init__(self, **kw):
        self.__dict__.update(kw)


@pytest.mark.parametrize("code", sorted(SCENARIOS))
def test_each_documented_code_is_produced_by_a_real_request(
    code, alice, scope_a, scope_c, append, served, api_client_for, settings, tmp_path
):
    world = World(alice=alice, scope_a=scope_a, scope_c=scope_c, append=append, served=served, settings=settings, tmp_path=tmp_path)
    response = SCENARIOS[code](api_client_for, world)
    assert response.status_code >= 400, response.content[:300]
    body = response.json()
    assert body["code"] == code, body
    assert set(body) == {"code", "message", "extra"}, body
    assert response.status_code == ERROR_CODES[code][0], (response.status_code, body)


def test_engine_errors_map_to_their_codes():
    from kvengine.errors import ConfigError, ContextTooLongError, OverloadedError

    refused = exception_handler(ConfigError("`quant` has to be one of ['none', 'q8', 'q4'] but got 'q3'"), {})
    assert refused.status_code == 400 and refused.data["code"] == "engine_refused"
    too_long = exception_handler(ContextTooLongError(num_tokens=9000, limit=8192), {})
    assert too_long.status_code == 422 and too_long.data["code"] == "context_too_long"
    # the engine's back-pressure (the web tier answers it with 429 + Retry-After) and the web's own bound
    assert error_code(OverloadedError(waiting=9, limit=8, retry_after_s=2.4)) == "overloaded"

    class Overloaded(MnesioError):
        status_code = 429

    assert error_code(Overloaded("busy")) == "overloaded"


def test_a_kind_names_the_code_of_an_error_raised_without_a_class_of_its_own():
    # compile's "erased during every attempt" and a task's refusal (its class name as kind) are plain errors
    assert error_code(Conflict("again", extra={"kind": "erased_during_compile"})) == "erased_during_compile"
    assert error_code(MnesioError("refused", extra={"kind": "GateFailed"}, status_code=409)) == "gate_failed"
    assert error_code(MnesioError("gone", status_code=404)) == "not_found"
    assert error_code(MnesioError("odd", status_code=418)) == "error"
    with pytest.raises(ValueError, match="ERROR_CODES"):
        MnesioError("x", code="made_up")


def test_every_documented_code_is_produced_somewhere():
    covered = set(SCENARIOS) | {"overloaded", "engine_refused", "erased_during_compile"}  # the two tests above
    for code, path in ELSEWHERE.items():
        source = (ROOT / path).read_text()
        assert re.search(rf'\["code"\] == "{code}"', source), f"{path} does not assert code {code!r}"
        covered.add(code)
    assert set(ERROR_CODES) - CATCH_ALL == covered, sorted(set(ERROR_CODES) - CATCH_ALL - covered)


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_error_class_and_kind_in_the_code_maps_to_a_documented_code():
    import django.apps

    assert django.apps.apps.ready
    import cartridges.services  # noqa: F401  (imports every error class of the apps)
    import cartridges.storage  # noqa: F401
    import memories.selectors  # noqa: F401

    for cls in _subclasses(MnesioError):
        exc = cls.__new__(cls)
        exc.extra = {}
        assert error_code(exc) in set(ERROR_CODES) - CATCH_ALL, cls
    # every literal kind an application error carries is a documented code
    kinds = set()
    for package in ("core", "memories", "cartridges", "mnesio_site"):
        for path in (ROOT / package).rglob("*.py"):
            kinds |= set(re.findall(r'"kind": "([a-z_]+)"', path.read_text()))
    assert kinds and kinds <= set(ERROR_CODES), sorted(kinds - set(ERROR_CODES))


def test_the_schema_documents_the_error_body_and_every_code(alice, api_client_for):
    schema = api_client_for(alice).get("/api/schema/?format=json").json()
    error = schema["components"]["schemas"]["Error"]
    assert error["required"] == ["code", "message", "extra"]
    assert error["properties"]["code"]["enum"] == list(ERROR_CODES)
    for code in ERROR_CODES:
        assert f"`{code}`" in error["properties"]["code"]["description"]
    num_operations = 0
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            num_operations += 1
            for status in ("400", "401", "404", "503"):
                content = operation["responses"][status]["content"]["application/json"]["schema"]
                assert content == {"$ref": "#/components/schemas/Error"}, (method, path, status)
    assert num_operations >= 18


def test_the_api_guide_table_lists_every_code():
    guide = (ROOT / "docs" / "api.md").read_text()
    listed = set(re.findall(r"^\| `([a-z_]+)` \| \d{3} \|", guide, flags=re.M))
    assert listed == set(ERROR_CODES), sorted(listed ^ set(ERROR_CODES))


def test_an_unmatched_api_path_is_a_json_404_with_a_code_and_other_paths_keep_the_html_page(alice, api_client_for):
    response = api_client_for(alice).get("/api/v1/scopes/scope-a/cartridges/not-a-number/")
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert response.json()["code"] == "not_found" and "not-a-number" in response.json()["message"]
    page = api_client_for(alice).get("/no-such-page/")
    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")
