"""Seal the question and answers of every existing evaluation case (the plaintext columns go in 0006).

Each case gets a key of its own wrapped by the current master key, exactly as
``cartridges.services.cases.evaluation_case_add`` does (same associated data, see
``cartridges.selectors.evaluation_case_aad``). Existing cases are not linked to subjects: nothing recorded
which memories they quote; an operator can re-add a case with ``subjects`` to have erasure reach it.
Reversible: unsealing writes the plaintext back (while the master key that wrapped the keys is configured).
"""
import json

from django.db import migrations


def _aad(case_id, part):
    return f"mnesio:evaluation-case:v1|{case_id}|{part}".encode()


def seal_cases(apps, schema_editor):
    from memories import crypto

    EvaluationCase = apps.get_model('cartridges', 'EvaluationCase')
    for case in EvaluationCase.objects.filter(wrapped_key__isnull=True, erased_at__isnull=True).iterator():
        key = crypto.new_data_key()
        # verify=False: the keyring's tables may not all exist at this point of the migration graph
        wrapped, wrapped_by = crypto.wrap(key, aad=_aad(case.pk, 'key'), verify=False)
        content = json.dumps({'question': case.question, 'answers': list(case.answers)}).encode()
        nonce, ciphertext = crypto.seal(key, content, aad=_aad(case.pk, 'content'))
        EvaluationCase.objects.filter(pk=case.pk).update(
            wrapped_key=wrapped, wrapped_by=wrapped_by, sealed=nonce + ciphertext, question='', answers=[]
        )


def unseal_cases(apps, schema_editor):
    from memories import crypto

    EvaluationCase = apps.get_model('cartridges', 'EvaluationCase')
    for case in EvaluationCase.objects.filter(wrapped_key__isnull=False).iterator():
        key = crypto.unwrap(bytes(case.wrapped_key), wrapped_by=case.wrapped_by, aad=_aad(case.pk, 'key'))
        sealed = bytes(case.sealed)
        content = json.loads(crypto.unseal(key, sealed[:crypto.NONCE_BYTES], sealed[crypto.NONCE_BYTES:], aad=_aad(case.pk, 'content')))
        EvaluationCase.objects.filter(pk=case.pk).update(question=content['question'], answers=content['answers'])


class Migration(migrations.Migration):

    dependencies = [
        ('cartridges', '0004_evaluation_case_sealed_fields'),
    ]

    operations = [
        migrations.RunPython(seal_cases, unseal_cases),
    ]
