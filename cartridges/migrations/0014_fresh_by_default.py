from django.db import migrations, models

# What a scope without a settings row got before this migration: scopes that exist keep it (a settings row saying
# so, written here), new ones refresh on append after 2 s.
MANUAL = {"auto_refresh": "manual", "auto_refresh_debounce_s": 60}


def keep_existing_scopes_manual(apps, schema_editor):
    Scope = apps.get_model("memories", "Scope")
    ScopeSettings = apps.get_model("cartridges", "ScopeSettings")
    db = schema_editor.connection.alias
    with_settings = ScopeSettings.objects.using(db).values_list("scope_id", flat=True)
    bare = Scope.objects.using(db).filter(deleted_at__isnull=True).exclude(pk__in=with_settings).values_list("pk", flat=True)
    ScopeSettings.objects.using(db).bulk_create(
        [ScopeSettings(scope_id=pk, keep_previous_versions=3, layout="auto", **MANUAL) for pk in bare.iterator()]
    )


class Migration(migrations.Migration):

    dependencies = [
        ('cartridges', '0013_routed_layout'),
        ('memories', '0009_api_token_profiles'),
    ]

    operations = [
        migrations.AlterField(
            model_name='scopesettings',
            name='auto_refresh',
            field=models.CharField(choices=[('manual', 'Manual'), ('on_append', 'On Append')], default='on_append', max_length=16),
        ),
        migrations.AlterField(
            model_name='scopesettings',
            name='auto_refresh_debounce_s',
            field=models.PositiveIntegerField(default=2),
        ),
        # reversing leaves the rows: they say what the old default said
        migrations.RunPython(keep_existing_scopes_manual, migrations.RunPython.noop),
    ]
