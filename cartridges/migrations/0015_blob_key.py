import pgtrigger.compiler
import pgtrigger.migrations
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('cartridges', '0014_fresh_by_default'),
        ('memories', '0010_search_index_tokenizer'),
    ]

    operations = [
        # the old triggers go while the table still has its old name (a trigger is dropped on the table it names)
        pgtrigger.migrations.RemoveTrigger(
            model_name='cartridgeblob',
            name='cartridgeblob_protect_update',
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name='cartridgeblob',
            name='cartridgeblob_protect_truncate',
        ),
        migrations.RenameModel(
            old_name='CartridgeBlob',
            new_name='BlobKey',
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='blobkey',
            trigger=pgtrigger.compiler.Trigger(name='blobkey_protect_update', sql=pgtrigger.compiler.UpsertTriggerSql(condition='WHEN (NOT (NEW.wrapped_by IS DISTINCT FROM OLD.wrapped_by AND NEW.id = OLD.id AND NEW.storage_name = OLD.storage_name AND NEW.scope_id = OLD.scope_id AND NEW.created_at = OLD.created_at))', func="RAISE EXCEPTION 'pgtrigger: Cannot update rows from % table', TG_TABLE_NAME;", hash='213598853fefc7429de1aed2becbc1d44d82917c', operation='UPDATE', pgid='pgtrigger_blobkey_protect_update_5c30b', table='cartridges_blobkey', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='blobkey',
            trigger=pgtrigger.compiler.Trigger(name='blobkey_protect_truncate', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'mnesio: % is append-only; TRUNCATE is not allowed', TG_TABLE_NAME; RETURN NULL;", hash='460ceb32774c3932c23e7b1f18d896acdf252c3a', level='STATEMENT', operation='TRUNCATE', pgid='pgtrigger_blobkey_protect_truncate_70a1a', table='cartridges_blobkey', when='BEFORE')),
        ),
    ]
