"""Evaluation cases get a wrapped key, sealed content, an erasure timestamp and the subjects they concern."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cartridges', '0003_blob_key_rewrap'),
        ('memories', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='evaluationcase',
            name='wrapped_key',
            field=models.BinaryField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='evaluationcase',
            name='wrapped_by',
            field=models.CharField(blank=True, default='', help_text='id of the master key that wrapped it', max_length=32),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name='evaluationcase',
            name='sealed',
            field=models.BinaryField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='evaluationcase',
            name='erased_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='evaluationcase',
            name='subjects',
            field=models.ManyToManyField(blank=True, related_name='evaluation_cases', to='memories.subject'),
        ),
        migrations.AddConstraint(
            model_name='evaluationcase',
            constraint=models.CheckConstraint(
                condition=models.Q(erased_at__isnull=True) | models.Q(wrapped_key__isnull=True, sealed__isnull=True),
                name='cartridges_evaluationcase_erased_has_no_key',
            ),
        ),
    ]
