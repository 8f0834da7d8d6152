"""Drop the plaintext question and answers of evaluation cases (sealed by 0005)."""
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
    ]
