"""Worlds of 1 or many rows for the query-count tests: the same shapes, only more of them."""
from __future__ import annotations

from typing import Any

from cartridges.models import CartridgeVersion
from cartridges.services import cartridge_activate, cartridge_answer, cartridge_compile, cartridge_evaluate
from memories.services import scope_create, scope_grant


def versions(*, scope: Any, append: Any, num_versions: int) -> list[CartridgeVersion]:
    """``num_versions`` versions of ``scope``: the first superseded, the last active, the ones between evaluated."""
    made = []
    for number in range(num_versions):
        append(scope, f"Memory number {number}: the spare key is under flowerpot {number}.", f"subject-{number}")
        made.append(cartridge_compile(scope=scope))
    cartridge_activate(version=made[0])
    for version in made[1:-1]:
        cartridge_evaluate(version=version)
    cartridge_activate(version=made[-1])
    return made


def scopes(*, user: Any, append: Any, num_scopes: int) -> list[Any]:
    """``num_scopes`` scopes granted to ``user``, each served by a version, answered once, with a memory since."""
    made = []
    for number in range(num_scopes):
        scope = scope_create(name=f"counted-{number}")
        scope_grant(scope=scope, user=user)
        versions(scope=scope, append=append, num_versions=2)
        cartridge_answer(scope=scope, question="Where is the spare key?", mode="cartridge")
        append(scope, f"Memory after the cartridge in scope {number}.")
        made.append(scope)
    return made
