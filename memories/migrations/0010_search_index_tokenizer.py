from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("memories", "0009_api_token_profiles"),
    ]

    operations = [
        # the indexes that exist were built unstemmed (tokenizer 1); new ones are built stemmed (2), and
        # search_index_backfill rebuilds the old ones
        migrations.AddField(
            model_name="searchindex",
            name="tokenizer",
            field=models.PositiveSmallIntegerField(default=1),
        ),
        migrations.AlterField(
            model_name="searchindex",
            name="tokenizer",
            field=models.PositiveSmallIntegerField(default=2),
        ),
    ]
