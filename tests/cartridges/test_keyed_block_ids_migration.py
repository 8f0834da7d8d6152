"""The migration that keys block ids per scope forgets the digests that outlived a destruction before it."""
from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.forms.models import model_to_dict

from cartridges.models import CartridgeBlock, CartridgeEvaluation, CartridgeVersion, CartridgeVersionBlock
from cartridges.services import cartridge_activate, cartridge_compile
from memories.services import erasure_request_file, erasure_request_process, memory_append

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

BEFORE = [("cartridges", "0011_evaluation_case_quoted_memories")]
PLAIN = "ab" * 32  # a plain id as stored before ids were keyed


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def test_it_blanks_destroyed_digests_and_drops_recorded_block_ids(scope_a, fake_engine, blob_root):
    for i in range(9):
        memory_append(scope=scope_a, content=f"Fact {i}: locker {i} holds item {i * 7}.", subject="dana" if i == 4 else None)
    version = cartridge_compile(scope=scope_a)
    cartridge_activate(version=version)
    request = erasure_request_file(subject="dana", scope=scope_a, requested_by=None, reason="asked")
    erasure_request_process(erasure_request=request)
    latest = [key for key in MigrationExecutor(connection).loader.graph.leaf_nodes() if key[0] == "cartridges"]
    try:
        old = _migrate(BEFORE)
        Block, Destruction = old.get_model("cartridges", "CartridgeBlock"), old.get_model("cartridges", "CartridgeBlockDestruction")
        Version, VersionDestruction = old.get_model("cartridges", "CartridgeVersion"), old.get_model("cartridges", "CartridgeDestruction")
        Evaluation = old.get_model("cartridges", "CartridgeEvaluation")
        template = model_to_dict(Block.objects.get(pk=CartridgeVersionBlock.objects.filter(version=version).first().block_id), exclude=["id"])
        template["scope_id"] = template.pop("scope")
        block = Block.objects.create(**{**template, "block_id": PLAIN, "part_sha256": PLAIN,
                                        "sha256": PLAIN, "storage_name": "scope-x/destroyed-before.kvb"})
        Destruction.objects.create(block=block, reason="erased before the upgrade", erasure_request_id=request.pk)
        fields = model_to_dict(Version.objects.get(pk=version.pk), exclude=["id", "supersedes", "configuration", "created_by"])
        fields["scope_id"] = fields.pop("scope")
        copy = Version.objects.create(**{**fields, "sha256": PLAIN, "payload_sha256": PLAIN, "log_head": version.log_head + 1000,
                                          "storage_name": "scope-x/destroyed-before.kvc"})
        VersionDestruction.objects.create(version=copy, reason="erased before the upgrade", erasure_request_id=request.pk)
        evaluation = Evaluation.objects.create(version_id=copy.pk, passed=True, reasons=[], config_key="k",
                                               figures={"gate": "full", "verified_blocks": [[PLAIN, PLAIN]]})
    finally:
        _migrate(latest)

    assert CartridgeBlock.objects.filter(pk=block.pk).values_list("block_id", "part_sha256", "sha256").get() == ("", "", "")
    assert CartridgeVersion.objects.filter(pk=copy.pk).values_list("sha256", "payload_sha256").get() == ("", "")
    assert CartridgeEvaluation.objects.get(pk=evaluation.pk).figures == {"gate": "full"}
