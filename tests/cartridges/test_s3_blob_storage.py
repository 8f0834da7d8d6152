"""Cartridge blobs on S3 (``MNESIO_BLOB_STORAGE=s3``) against a real S3-compatible server: moto in server mode
on a loopback port, spoken to over HTTP by django-storages/boto3 exactly as AWS would be.

Each guarantee of the local store is checked on the bucket itself (listed with a separate boto3 client):
blobs are stored encrypted and read back through the hash checks, a corrupted object is refused, destroying a
version deletes its object (every version of it in a versioned bucket), an erasure leaves no blob of the
erased version in the bucket, and a storage outage is a 503 that stores nothing.
"""
from __future__ import annotations

import pytest

from cartridges.models import BlobKey, CartridgeVersion
from cartridges.selectors import active_version, version_state
from cartridges.services import cartridge_activate, cartridge_answer, cartridge_compile
from cartridges.storage import (
    BlobStorageUnavailable,
    BlobTampered,
    BlobUnavailable,
    blob_destroy,
    blob_read,
    blob_storage,
    blob_storage_check,
    blobs_sweep,
)
from memories.models import ErasureStatus
from memories.selectors import erasure_request_status
from memories.services import erasure_request_file, erasure_request_process, memory_append
from tests.support.procs import MotoS3, free_port

pytestmark = pytest.mark.django_db

SECRET = "Dana's locker code is 4417."


@pytest.fixture(scope="module")
def moto_s3(tmp_path_factory):
    server = MotoS3(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.stop()


@pytest.fixture(params=[False, True], ids=["plain-bucket", "versioned-bucket"])
def bucket(request, moto_s3, settings):
    """A fresh bucket as STORAGES["cartridges"] (overrides the local temp dir of tests/cartridges/conftest.py)."""
    name = moto_s3.bucket(versioned=request.param)
    settings.STORAGES = {**settings.STORAGES, "cartridges": moto_s3.storage_setting(name)}
    return name


def _served(scope):
    memory_append(scope=scope, content="The spare key is under the blue flowerpot.")
    memory_append(scope=scope, subject="dana", content=SECRET)
    version = cartridge_compile(scope=scope)
    cartridge_activate(version=version)
    return version


def test_it_stores_reads_and_destroys_a_blob_in_the_bucket(moto_s3, bucket, scope_a, fake_engine):
    version = _served(scope_a)
    assert moto_s3.keys(bucket) == [version.storage_name]
    stored = moto_s3.client.get_object(Bucket=bucket, Key=version.storage_name)["Body"].read()
    assert len(stored) == version.stored_size_bytes and b"4417" not in stored and b"locker" not in stored  # ciphertext
    assert blob_read(version=version)  # through the stored sha256, the GCM tag and the file sha256
    answer = cartridge_answer(scope=scope_a, question="What is Dana's locker code?")
    assert answer.version_id == version.pk and "4417" in answer.answer

    assert blob_destroy(storage_name=version.storage_name)
    assert moto_s3.keys(bucket) == []
    assert moto_s3.all_versions(bucket) == []  # no older version, no delete marker: the bytes are gone
    assert not BlobKey.objects.filter(storage_name=version.storage_name).exists()
    with pytest.raises(BlobUnavailable):
        blob_read(version=version)
    assert blob_destroy(storage_name=version.storage_name) is False  # twice is fine


def test_erasure_removes_every_blob_of_the_erased_version_from_the_bucket(moto_s3, bucket, scope_a, fake_engine):
    first = _served(scope_a)
    memory_append(scope=scope_a, content="The car is parked on level 3.")
    second = cartridge_compile(scope=scope_a)  # a second version holding the subject, never activated
    cartridge_activate(version=second)
    assert set(moto_s3.keys(bucket)) == {first.storage_name, second.storage_name}

    request = erasure_request_file(subject="dana", requested_by=None, reason="asked to be forgotten")
    erasure_request_process(erasure_request=request)
    assert erasure_request_status(erasure_request=request) == ErasureStatus.VIEWS_REBUILT
    rebuilt = active_version(scope=scope_a)
    assert rebuilt is not None and rebuilt.pk not in (first.pk, second.pk)
    assert version_state(version=first) == version_state(version=second) == "destroyed"
    # the bucket holds the rebuilt blob and nothing of the erased versions, in any version of any key
    assert moto_s3.keys(bucket) == [rebuilt.storage_name]
    assert {key for key, _ in moto_s3.all_versions(bucket)} == {rebuilt.storage_name}
    answer = cartridge_answer(scope=scope_a, question="What is Dana's locker code?")
    assert answer.version_id == rebuilt.pk and "4417" not in answer.answer


def test_a_corrupted_object_is_refused(moto_s3, bucket, scope_a, fake_engine):
    version = _served(scope_a)
    stored = bytearray(moto_s3.client.get_object(Bucket=bucket, Key=version.storage_name)["Body"].read())
    stored[-5] ^= 0xFF
    moto_s3.client.put_object(Bucket=bucket, Key=version.storage_name, Body=bytes(stored))
    with pytest.raises(BlobTampered) as exc:
        blob_read(version=version)
    assert exc.value.extra["check"] == "stored_sha256"


def test_a_blob_missing_from_the_bucket_is_unavailable_not_tampered(moto_s3, bucket, scope_a, fake_engine):
    version = _served(scope_a)
    moto_s3.client.delete_object(Bucket=bucket, Key=version.storage_name)
    with pytest.raises(BlobUnavailable) as exc:
        blob_read(version=version)
    assert "missing from storage" in exc.value.message


def test_an_existing_name_is_never_written_over(moto_s3, bucket, scope_a, fake_engine):
    version = _served(scope_a)
    before = moto_s3.client.get_object(Bucket=bucket, Key=version.storage_name)["Body"].read()
    from django.core.files.base import ContentFile

    saved = blob_storage().save(version.storage_name, ContentFile(b"someone else's bytes"))
    assert saved != version.storage_name  # the storage picked another name (blob_write refuses such a rename)
    assert moto_s3.client.get_object(Bucket=bucket, Key=version.storage_name)["Body"].read() == before
    blob_storage().delete(saved)


def test_the_storage_check_writes_reads_and_deletes_a_probe(moto_s3, bucket):
    blob_storage_check()
    assert moto_s3.keys(bucket) == [] and moto_s3.all_versions(bucket) == []


def test_an_unreachable_s3_is_a_503_that_stores_nothing(moto_s3, settings, scope_a, fake_engine):
    dead = moto_s3.storage_setting("no-such-bucket")
    dead["OPTIONS"] = {**dead["OPTIONS"], "endpoint_url": f"http://127.0.0.1:{free_port()}"}  # nobody listens
    # fail fast: one attempt, short timeouts (boto3 would otherwise retry for seconds)
    from botocore.config import Config

    dead["OPTIONS"]["client_config"] = Config(connect_timeout=1, read_timeout=1, retries={"max_attempts": 1},
                                              s3={"addressing_style": "path"}, signature_version="s3v4")
    settings.STORAGES = {**settings.STORAGES, "cartridges": dead}
    memory_append(scope=scope_a, content="The spare key is under the blue flowerpot.")
    with pytest.raises(BlobStorageUnavailable) as exc:
        cartridge_compile(scope=scope_a)
    assert exc.value.status_code == 503 and exc.value.extra["errno"] == "EIO"
    assert CartridgeVersion.objects.count() == 0  # no version row pointing at nothing
    with pytest.raises(BlobStorageUnavailable):
        blob_storage_check()
    # the blob key could not be dropped with its (unconfirmed) object: it stays for the orphan sweep, which
    # removes it once the storage answers again (cartridge_sweep / the beat task)
    (leftover,) = BlobKey.objects.values_list("storage_name", flat=True)
    settings.STORAGES = {**settings.STORAGES, "cartridges": moto_s3.storage_setting(moto_s3.bucket())}
    assert blobs_sweep(older_than_s=0) == [leftover] and BlobKey.objects.count() == 0


def test_a_missing_bucket_is_a_503_not_a_missing_blob(moto_s3, settings, scope_a, fake_engine):
    settings.STORAGES = {**settings.STORAGES, "cartridges": moto_s3.storage_setting("mnesio-bucket-never-made")}
    memory_append(scope=scope_a, content="The spare key is under the blue flowerpot.")
    with pytest.raises(BlobStorageUnavailable):
        cartridge_compile(scope=scope_a)
    with pytest.raises(BlobStorageUnavailable):
        blob_storage_check()


def test_the_storage_check_fails_on_an_unwritable_local_store(settings, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    settings.STORAGES = {**settings.STORAGES, "cartridges": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(blocker / "blobs")}}}
    with pytest.raises(BlobStorageUnavailable) as exc:
        blob_storage_check()
    assert exc.value.extra["errno"] == "ENOTDIR"
    settings.STORAGES = {**settings.STORAGES, "cartridges": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "ok")}}}
    blob_storage_check()
    assert [p for p in (tmp_path / "ok").rglob("*") if p.is_file()] == []  # the probe is deleted


def test_a_large_blob_goes_up_in_parts_and_comes_back_whole(moto_s3, bucket):
    """Above boto3's 8 MB threshold the upload is multipart (an 8k-token f32 cartridge is ~380 MB): still one
    object, visible only once complete, read back byte for byte, and deleted entirely."""
    import hashlib
    import os

    from django.core.files.base import ContentFile

    data = os.urandom(17 * 1024 * 1024)
    storage = blob_storage()
    assert storage.save("scope-0/large.kvc", ContentFile(data)) == "scope-0/large.kvc"
    etag = moto_s3.client.head_object(Bucket=bucket, Key="scope-0/large.kvc")["ETag"].strip('"')
    assert etag.endswith("-3")  # three parts: 8 MB, 8 MB and 1 MB
    with storage.open("scope-0/large.kvc", "rb") as fh:
        assert hashlib.sha256(fh.read()).digest() == hashlib.sha256(data).digest()
    storage.delete("scope-0/large.kvc")
    assert moto_s3.keys(bucket) == [] and moto_s3.all_versions(bucket) == []


def test_it_deletes_every_version_on_a_retry_after_the_delete_marker_was_written(moto_s3, scope_a, fake_engine,
                                                                                 settings, monkeypatch):
    """A destroy whose first attempt wrote the delete marker and then failed to list the versions: the key now
    looks absent (exists() is False), and the retry still has to delete the object's old version."""
    from cartridges.s3 import CartridgeS3Storage

    name = moto_s3.bucket(versioned=True)
    settings.STORAGES = {**settings.STORAGES, "cartridges": moto_s3.storage_setting(name)}
    version = _served(scope_a)
    listing = CartridgeS3Storage._versions

    def listing_fails(self, key):
        raise OSError(5, "S3 timed out listing versions")

    monkeypatch.setattr(CartridgeS3Storage, "_versions", listing_fails)
    with pytest.raises(BlobStorageUnavailable):
        blob_destroy(storage_name=version.storage_name)
    assert not blob_storage().exists(version.storage_name)  # the delete marker hides the key
    assert len(moto_s3.all_versions(name)) == 2  # the object's version and the marker
    assert BlobKey.objects.filter(storage_name=version.storage_name).exists()  # not reported destroyed

    monkeypatch.setattr(CartridgeS3Storage, "_versions", listing)
    blob_destroy(storage_name=version.storage_name)
    assert moto_s3.all_versions(name) == []  # the old version is gone too, not only hidden
    assert not BlobKey.objects.filter(storage_name=version.storage_name).exists()
