"""Block ids keyed per scope (ScopeBlockSecret); what outlived a destruction forgets its digests.

Ids already stored were plain sha256 of public values and token ids: the ids and part digests of destroyed blocks,
the digests of versions an erasure destroyed, and the block ids evaluations recorded as verified are blanked or
dropped here (the triggers allow exactly these changes). Live blocks keep their rows; the next compile of each
scope computes keyed ids, so it recomputes its blocks once, and its next gate runs in full.
"""

import django.db.models.deletion
import pgtrigger.compiler
import pgtrigger.migrations
from django.db import migrations, models


def forget_digests(apps, schema_editor) -> None:
    block = apps.get_model("cartridges", "CartridgeBlock")
    version = apps.get_model("cartridges", "CartridgeVersion")
    evaluation = apps.get_model("cartridges", "CartridgeEvaluation")
    block.objects.filter(destruction__isnull=False).exclude(block_id="", part_sha256="", sha256="").update(
        block_id="", part_sha256="", sha256=""
    )
    version.objects.filter(destruction__erasure_request__isnull=False).exclude(sha256="", payload_sha256="").update(
        sha256="", payload_sha256=""
    )
    for pk, figures in evaluation.objects.filter(figures__has_key="verified_blocks").values_list("pk", "figures"):
        evaluation.objects.filter(pk=pk).update(figures={k: v for k, v in figures.items() if k != "verified_blocks"})


class Migration(migrations.Migration):

    dependencies = [
        ('cartridges', '0011_evaluation_case_quoted_memories'),
        ('memories', '0007_master_key_rotation'),
    ]

    operations = [
        migrations.CreateModel(
            name='ScopeBlockSecret',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('wrapped_key', models.BinaryField()),
                ('wrapped_by', models.CharField(help_text='id of the master key that wrapped it', max_length=32)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name='cartridgeblock',
            name='cartridgeblock_protect_update',
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name='cartridgeevaluation',
            name='cartridgeevaluation_protect_update',
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name='cartridgeversion',
            name='cartridgeversion_protect_update',
        ),
        migrations.AlterField(
            model_name='cartridgeblock',
            name='block_id',
            field=models.CharField(help_text="chain id: HMAC-SHA256 under the scope's block secret over parent id, key, position and token ids", max_length=64),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgeblock',
            trigger=pgtrigger.compiler.Trigger(name='cartridgeblock_protect_update', sql=pgtrigger.compiler.UpsertTriggerSql(condition="WHEN (NOT (NEW.block_id = '' AND NEW.part_sha256 = '' AND NEW.sha256 = '' AND (to_jsonb(NEW) - ARRAY['block_id', 'part_sha256', 'sha256']) = (to_jsonb(OLD) - ARRAY['block_id', 'part_sha256', 'sha256'])))", func="RAISE EXCEPTION 'pgtrigger: Cannot update rows from % table', TG_TABLE_NAME;", hash='ea8dafdcbdb256fa2984f402c61dcf7afb256896', operation='UPDATE', pgid='pgtrigger_cartridgeblock_protect_update_d9f9c', table='cartridges_cartridgeblock', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgeevaluation',
            trigger=pgtrigger.compiler.Trigger(name='cartridgeevaluation_protect_update', sql=pgtrigger.compiler.UpsertTriggerSql(condition="WHEN (NOT ((to_jsonb(NEW) - 'figures') = (to_jsonb(OLD) - 'figures') AND NEW.figures::jsonb = (OLD.figures::jsonb - 'verified_blocks')))", func="RAISE EXCEPTION 'pgtrigger: Cannot update rows from % table', TG_TABLE_NAME;", hash='cf94c96e39c8179c5ebaebf2a907a17a9737ecf0', operation='UPDATE', pgid='pgtrigger_cartridgeevaluation_protect_update_c924a', table='cartridges_cartridgeevaluation', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgeversion',
            trigger=pgtrigger.compiler.Trigger(name='cartridgeversion_protect_update', sql=pgtrigger.compiler.UpsertTriggerSql(condition="WHEN (NOT (NEW.sha256 = '' AND NEW.payload_sha256 = '' AND (to_jsonb(NEW) - ARRAY['sha256', 'payload_sha256']) = (to_jsonb(OLD) - ARRAY['sha256', 'payload_sha256'])))", func="RAISE EXCEPTION 'pgtrigger: Cannot update rows from % table', TG_TABLE_NAME;", hash='cb8cb4d360df6755154fde667ca6c8e357719367', operation='UPDATE', pgid='pgtrigger_cartridgeversion_protect_update_fc08d', table='cartridges_cartridgeversion', when='BEFORE')),
        ),
        migrations.AddField(
            model_name='scopeblocksecret',
            name='scope',
            field=models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='memories.scope'),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='scopeblocksecret',
            trigger=pgtrigger.compiler.Trigger(name='scopeblocksecret_protect_update', sql=pgtrigger.compiler.UpsertTriggerSql(condition='WHEN (NOT (NEW.wrapped_by IS DISTINCT FROM OLD.wrapped_by AND NEW.id = OLD.id AND NEW.scope_id = OLD.scope_id AND NEW.created_at = OLD.created_at))', func="RAISE EXCEPTION 'pgtrigger: Cannot update rows from % table', TG_TABLE_NAME;", hash='57c18e88c38ddad203e56386dff5bf4056df652b', operation='UPDATE', pgid='pgtrigger_scopeblocksecret_protect_update_093d8', table='cartridges_scopeblocksecret', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='scopeblocksecret',
            trigger=pgtrigger.compiler.Trigger(name='scopeblocksecret_protect_truncate', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'mnesio: % is append-only; TRUNCATE is not allowed', TG_TABLE_NAME; RETURN NULL;", hash='a62816a12a3b7af49c433ca9928c84c0182487e6', level='STATEMENT', operation='TRUNCATE', pgid='pgtrigger_scopeblocksecret_protect_truncate_c28f4', table='cartridges_scopeblocksecret', when='BEFORE')),
        ),
        migrations.RunPython(forget_digests, migrations.RunPython.noop),
    ]
