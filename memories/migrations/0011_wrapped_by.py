import pgtrigger.compiler
import pgtrigger.migrations
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('memories', '0010_search_index_tokenizer'),
    ]

    operations = [
        pgtrigger.migrations.RemoveTrigger(
            model_name='scopekey',
            name='protect_update',
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name='subject',
            name='protect_update',
        ),
        migrations.RenameField(
            model_name='scopekey',
            old_name='master_key_id',
            new_name='wrapped_by',
        ),
        migrations.RenameField(
            model_name='searchindex',
            old_name='master_key_id',
            new_name='wrapped_by',
        ),
        migrations.RenameField(
            model_name='subject',
            old_name='master_key_id',
            new_name='wrapped_by',
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='scopekey',
            trigger=pgtrigger.compiler.Trigger(name='protect_update', sql=pgtrigger.compiler.UpsertTriggerSql(condition='WHEN (NOT (((OLD.shredded_at IS NULL AND NEW.shredded_at IS NOT NULL AND NEW.wrapped_key IS NULL AND NEW.key_generation = OLD.key_generation) OR (OLD.shredded_at IS NULL AND NEW.shredded_at IS NULL AND NEW.wrapped_key IS NOT NULL AND ((NEW.wrapped_by IS DISTINCT FROM OLD.wrapped_by AND NEW.key_generation = OLD.key_generation) OR NEW.key_generation = OLD.key_generation + 1))) AND NEW.id = OLD.id AND NEW.scope_id = OLD.scope_id AND NEW.created_at = OLD.created_at))', func="RAISE EXCEPTION 'pgtrigger: Cannot update rows from % table', TG_TABLE_NAME;", hash='2d5a18101a4b722369d8e39f1ae7dc5f2e8655b8', operation='UPDATE', pgid='pgtrigger_protect_update_7d6a4', table='memories_scopekey', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='subject',
            trigger=pgtrigger.compiler.Trigger(name='protect_update', sql=pgtrigger.compiler.UpsertTriggerSql(condition='WHEN (NOT (((OLD.shredded_at IS NULL AND NEW.shredded_at IS NOT NULL AND NEW.wrapped_key IS NULL AND NEW.key_generation = OLD.key_generation) OR (OLD.shredded_at IS NULL AND NEW.shredded_at IS NULL AND NEW.wrapped_key IS NOT NULL AND ((NEW.wrapped_by IS DISTINCT FROM OLD.wrapped_by AND NEW.key_generation = OLD.key_generation) OR NEW.key_generation = OLD.key_generation + 1))) AND NEW.id = OLD.id AND NEW.external_id = OLD.external_id AND NEW.created_at = OLD.created_at AND NEW.scope_id IS NOT DISTINCT FROM OLD.scope_id))', func="RAISE EXCEPTION 'pgtrigger: Cannot update rows from % table', TG_TABLE_NAME;", hash='fa0a6b8546e0cf343e2fda5eacf93978e782322d', operation='UPDATE', pgid='pgtrigger_protect_update_bc80f', table='memories_subject', when='BEFORE')),
        ),
        migrations.AlterField(
            model_name='scopekey',
            name='wrapped_by',
            field=models.CharField(help_text='id of the master key that wrapped it', max_length=16),
        ),
        migrations.AlterField(
            model_name='searchindex',
            name='wrapped_by',
            field=models.CharField(help_text='id of the master key that wrapped it', max_length=16),
        ),
        migrations.AlterField(
            model_name='subject',
            name='wrapped_by',
            field=models.CharField(help_text='id of the master key that wrapped it', max_length=16),
        ),
    ]
