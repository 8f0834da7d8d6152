"""Convert every plaintext DRF token (rest_framework.authtoken) into a hashed knox token with the same secret,
then delete the plaintext rows: existing clients keep sending the same ``Authorization: Token <key>``."""
from django.db import migrations


def tokens_hash(apps, schema_editor):
    """Store each legacy key as knox does (lookup prefix + digest) and delete the plaintext row."""
    from knox.crypto import hash_token
    from knox.settings import CONSTANTS

    Token = apps.get_model("authtoken", "Token")
    AuthToken = apps.get_model("knox", "AuthToken")
    for legacy in Token.objects.all():
        digest = hash_token(legacy.key)
        if not AuthToken.objects.filter(digest=digest).exists():
            AuthToken(
                digest=digest, token_key=legacy.key[: CONSTANTS.TOKEN_KEY_LENGTH], user_id=legacy.user_id, expiry=None
            ).save(force_insert=True)
        legacy.delete()


class Migration(migrations.Migration):

    dependencies = [
        ("memories", "0002_permissions_per_scope_subjects"),
        ("authtoken", "0004_alter_tokenproxy_options"),
        ("knox", "0009_extend_authtoken_field"),
    ]

    # No way back: the plaintext secrets are not kept anywhere.
    operations = [migrations.RunPython(tokens_hash, migrations.RunPython.noop)]
