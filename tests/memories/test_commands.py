"""Operator commands: create_scope, grant_scope, and flush refusing to empty a non-test log."""
from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from memories.models import Scope, ScopeGrant

pytestmark = pytest.mark.django_db


def test_create_scope_and_grant_scope(alice, charlie):
    call_command("create_scope", "ops", "--description", "operators", "--grant", "alice", stdout=io.StringIO())
    scope = Scope.objects.get(name="ops")
    assert list(ScopeGrant.objects.filter(scope=scope).values_list("user__username", flat=True)) == ["alice"]
    call_command("grant_scope", "ops", "charlie", stdout=io.StringIO())
    call_command("grant_scope", "ops", "charlie", stdout=io.StringIO())  # idempotent
    assert ScopeGrant.objects.filter(scope=scope).count() == 2


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["create_scope", "Not A Slug"], "`name`"),
        (["create_scope", "scope-a"], "`name` 'scope-a' is already a scope"),
        (["create_scope", "x", "--grant", "nobody"], "`--grant`"),
        (["grant_scope", "nope", "alice"], "`scope`"),
        (["grant_scope", "scope-a", "nobody"], "`username`"),
    ],
)
def test_commands_name_what_is_wrong(alice, args, fragment):
    with pytest.raises(CommandError, match=fragment):
        call_command(*args, stdout=io.StringIO())


def test_flush_refuses_to_empty_a_non_test_log(scope_a, monkeypatch):
    from memories.management.commands import flush
    from memories.services import memory_append

    memory_append(scope=scope_a, content="kept")
    monkeypatch.setitem(flush.connections["default"].settings_dict, "NAME", "mnesio")
    with pytest.raises(CommandError, match="append-only: flushing would erase its 1 memories"):
        call_command("flush", interactive=False, stdout=io.StringIO())
    monkeypatch.undo()
    from memories.models import Memory

    assert Memory.objects.count() == 1


@pytest.mark.postgres
def test_flush_ignores_the_truncate_triggers_only_on_a_test_database(monkeypatch):
    import pgtrigger

    from memories.management.commands import flush

    used = []
    monkeypatch.setattr(pgtrigger, "ignore", lambda *uris, **kw: used.append(uris) or pytest.fail("ignored"))
    monkeypatch.setattr(flush.FlushCommand, "handle", lambda self, **options: "flushed")
    monkeypatch.setitem(flush.connections["default"].settings_dict, "NAME", "mnesio")
    assert flush.Command().handle(database="default") == "flushed"  # empty log: allowed, triggers not ignored
    assert used == []
