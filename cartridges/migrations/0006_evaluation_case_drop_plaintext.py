"""Drop the plaintext question and answers of evaluation cases (sealed by 0005); then the rest of the
schema: answer requests keep their error's status and kind, operator permissions, and TRUNCATE refused on
every append-only table (separate update and delete triggers, as the log's)."""
import pgtrigger.compiler
import pgtrigger.migrations
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cartridges', '0005_evaluation_case_seal_plaintext'),
    ]

    operations = [
        # defaults first, so that reversing restores the columns (empty) on a table with rows; 0005's reverse fills them
        migrations.AlterField(
            model_name='evaluationcase',
            name='question',
            field=models.TextField(default=''),
        ),
        migrations.AlterField(
            model_name='evaluationcase',
            name='answers',
            field=models.JSONField(default=list, help_text='accepted answers; a case counts as correct when one appears in the answer'),
        ),
        migrations.RemoveField(
            model_name='evaluationcase',
            name='question',
        ),
        migrations.RemoveField(
            model_name='evaluationcase',
            name='answers',
        ),
        migrations.AlterModelOptions(
            name='cartridgeversion',
            options={'ordering': ['-id'], 'permissions': [('compile_cartridge', "Can compile a scope's cartridge"), ('evaluate_cartridge', 'Can evaluate (run the gate on) a cartridge version'), ('activate_cartridge', 'Can activate a cartridge version or roll a scope back')]},
        ),
        migrations.AlterModelOptions(
            name='kvconfiguration',
            options={'ordering': ['-created_at', '-id'], 'permissions': [('switch_kvconfiguration', 'Can switch the active KV configuration')]},
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name='cartridgeactivation',
            name='cartridgeactivation_protect',
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name='cartridgedestruction',
            name='cartridgedestruction_protect',
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name='cartridgeevaluation',
            name='cartridgeevaluation_protect',
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name='cartridgeversion',
            name='cartridgeversion_protect',
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name='cartridgeversionsubject',
            name='cartridgeversionsubject_protect',
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name='kvconfiguration',
            name='kvconfiguration_protect',
        ),
        migrations.AddField(
            model_name='answerrequest',
            name='error_kind',
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name='answerrequest',
            name='error_status',
            field=models.PositiveSmallIntegerField(blank=True, null=True),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgeactivation',
            trigger=pgtrigger.compiler.Trigger(name='cartridgeactivation_protect_update', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'pgtrigger: Cannot update rows from % table', TG_TABLE_NAME;", hash='2bc6f3c055c697bc860d88cc3913824467916843', operation='UPDATE', pgid='pgtrigger_cartridgeactivation_protect_update_fbb3e', table='cartridges_cartridgeactivation', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgeactivation',
            trigger=pgtrigger.compiler.Trigger(name='cartridgeactivation_protect_delete', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'pgtrigger: Cannot delete rows from % table', TG_TABLE_NAME;", hash='2dfcd11a7726a6ddf710e9f90220a4693b1a69dc', operation='DELETE', pgid='pgtrigger_cartridgeactivation_protect_delete_dcf63', table='cartridges_cartridgeactivation', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgeactivation',
            trigger=pgtrigger.compiler.Trigger(name='cartridgeactivation_protect_truncate', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'mnesio: % is append-only; TRUNCATE is not allowed', TG_TABLE_NAME; RETURN NULL;", hash='ceb0628dedf2f2fe9b6a038f5ef3c836f40d3bbe', level='STATEMENT', operation='TRUNCATE', pgid='pgtrigger_cartridgeactivation_protect_truncate_7632c', table='cartridges_cartridgeactivation', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgeblob',
            trigger=pgtrigger.compiler.Trigger(name='cartridgeblob_protect_truncate', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'mnesio: % is append-only; TRUNCATE is not allowed', TG_TABLE_NAME; RETURN NULL;", hash='af5b252ec40f707552468c7bf448183e9b3d0f29', level='STATEMENT', operation='TRUNCATE', pgid='pgtrigger_cartridgeblob_protect_truncate_aa1d1', table='cartridges_cartridgeblob', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgedestruction',
            trigger=pgtrigger.compiler.Trigger(name='cartridgedestruction_protect_update', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'pgtrigger: Cannot update rows from % table', TG_TABLE_NAME;", hash='e3e960a4618226faed2e3ef0740488fa506b452f', operation='UPDATE', pgid='pgtrigger_cartridgedestruction_protect_update_abed3', table='cartridges_cartridgedestruction', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgedestruction',
            trigger=pgtrigger.compiler.Trigger(name='cartridgedestruction_protect_delete', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'pgtrigger: Cannot delete rows from % table', TG_TABLE_NAME;", hash='4d4b9b1e4c10e1f18b88fc4404f6558debf1634e', operation='DELETE', pgid='pgtrigger_cartridgedestruction_protect_delete_f1096', table='cartridges_cartridgedestruction', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgedestruction',
            trigger=pgtrigger.compiler.Trigger(name='cartridgedestruction_protect_truncate', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'mnesio: % is append-only; TRUNCATE is not allowed', TG_TABLE_NAME; RETURN NULL;", hash='b670cd5a9716f6f2aba25c57b7dcf3451eb5258b', level='STATEMENT', operation='TRUNCATE', pgid='pgtrigger_cartridgedestruction_protect_truncate_a0878', table='cartridges_cartridgedestruction', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgeevaluation',
            trigger=pgtrigger.compiler.Trigger(name='cartridgeevaluation_protect_update', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'pgtrigger: Cannot update rows from % table', TG_TABLE_NAME;", hash='d9a7e38dabb82d82ce8c15ac49a6a232b2b931f3', operation='UPDATE', pgid='pgtrigger_cartridgeevaluation_protect_update_c924a', table='cartridges_cartridgeevaluation', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgeevaluation',
            trigger=pgtrigger.compiler.Trigger(name='cartridgeevaluation_protect_delete', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'pgtrigger: Cannot delete rows from % table', TG_TABLE_NAME;", hash='03b8eb5917179ff5a6e09503735fc2b94fb08eb8', operation='DELETE', pgid='pgtrigger_cartridgeevaluation_protect_delete_b0ae2', table='cartridges_cartridgeevaluation', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgeevaluation',
            trigger=pgtrigger.compiler.Trigger(name='cartridgeevaluation_protect_truncate', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'mnesio: % is append-only; TRUNCATE is not allowed', TG_TABLE_NAME; RETURN NULL;", hash='050601f1d7253bad3bc9f506b03ddb07d66318fa', level='STATEMENT', operation='TRUNCATE', pgid='pgtrigger_cartridgeevaluation_protect_truncate_ee9f8', table='cartridges_cartridgeevaluation', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgeversion',
            trigger=pgtrigger.compiler.Trigger(name='cartridgeversion_protect_update', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'pgtrigger: Cannot update rows from % table', TG_TABLE_NAME;", hash='676071c2b5ccd3fa000d3ccc8d64450cd58fb967', operation='UPDATE', pgid='pgtrigger_cartridgeversion_protect_update_fc08d', table='cartridges_cartridgeversion', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgeversion',
            trigger=pgtrigger.compiler.Trigger(name='cartridgeversion_protect_delete', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'pgtrigger: Cannot delete rows from % table', TG_TABLE_NAME;", hash='4767e8ce511209ea4e689a4e7a91a00b70a585a6', operation='DELETE', pgid='pgtrigger_cartridgeversion_protect_delete_7ff5f', table='cartridges_cartridgeversion', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgeversion',
            trigger=pgtrigger.compiler.Trigger(name='cartridgeversion_protect_truncate', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'mnesio: % is append-only; TRUNCATE is not allowed', TG_TABLE_NAME; RETURN NULL;", hash='31bfffcf276bf71a9a8c42db8891b6b7626d4981', level='STATEMENT', operation='TRUNCATE', pgid='pgtrigger_cartridgeversion_protect_truncate_48352', table='cartridges_cartridgeversion', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgeversionsubject',
            trigger=pgtrigger.compiler.Trigger(name='cartridgeversionsubject_protect_update', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'pgtrigger: Cannot update rows from % table', TG_TABLE_NAME;", hash='5fa209e420ef1d37230c7fbac0958a9ddea3724b', operation='UPDATE', pgid='pgtrigger_cartridgeversionsubject_protect_update_71748', table='cartridges_cartridgeversionsubject', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgeversionsubject',
            trigger=pgtrigger.compiler.Trigger(name='cartridgeversionsubject_protect_delete', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'pgtrigger: Cannot delete rows from % table', TG_TABLE_NAME;", hash='c3c124dbea6ed7fdc26341e81df68f31faf7a9c0', operation='DELETE', pgid='pgtrigger_cartridgeversionsubject_protect_delete_95575', table='cartridges_cartridgeversionsubject', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='cartridgeversionsubject',
            trigger=pgtrigger.compiler.Trigger(name='cartridgeversionsubject_protect_truncate', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'mnesio: % is append-only; TRUNCATE is not allowed', TG_TABLE_NAME; RETURN NULL;", hash='20c08b7764671280c941b0866c9d698affcdb407', level='STATEMENT', operation='TRUNCATE', pgid='pgtrigger_cartridgeversionsubject_protect_truncate_da53d', table='cartridges_cartridgeversionsubject', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='kvconfiguration',
            trigger=pgtrigger.compiler.Trigger(name='kvconfiguration_protect_update', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'pgtrigger: Cannot update rows from % table', TG_TABLE_NAME;", hash='f2637ee162ddaa2cfb1ebb002a2f71ead8bb87e1', operation='UPDATE', pgid='pgtrigger_kvconfiguration_protect_update_ee776', table='cartridges_kvconfiguration', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='kvconfiguration',
            trigger=pgtrigger.compiler.Trigger(name='kvconfiguration_protect_delete', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'pgtrigger: Cannot delete rows from % table', TG_TABLE_NAME;", hash='56e92e1b9233b64b2e5f94683eb7fe875a1961a3', operation='DELETE', pgid='pgtrigger_kvconfiguration_protect_delete_c9998', table='cartridges_kvconfiguration', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='kvconfiguration',
            trigger=pgtrigger.compiler.Trigger(name='kvconfiguration_protect_truncate', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'mnesio: % is append-only; TRUNCATE is not allowed', TG_TABLE_NAME; RETURN NULL;", hash='7c36293e30123fec9948f5112b7a0f755f97d911', level='STATEMENT', operation='TRUNCATE', pgid='pgtrigger_kvconfiguration_protect_truncate_18a34', table='cartridges_kvconfiguration', when='BEFORE')),
        ),
    ]
