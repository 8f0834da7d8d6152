"""MNESIO_BLOB_STORAGE selects where cartridge blobs live: local files (default) or an S3 bucket; bad or
incomplete S3 settings stop the process naming the variable. Each case runs settings.py afresh."""
from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from tests.support.procs import MotoS3


def test_blobs_default_to_local_files_under_the_data_dir(load, tmp_path):
    s = load()
    assert s["STORAGES"]["cartridges"] == {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "cartridges")}}
    assert load(MNESIO_BLOB_ROOT="/srv/blobs")["STORAGES"]["cartridges"]["OPTIONS"] == {"location": "/srv/blobs"}


def test_a_named_backend_keeps_working(load):
    s = load(MNESIO_BLOB_STORAGE_BACKEND="django.core.files.storage.FileSystemStorage", MNESIO_BLOB_ROOT="/srv/b")
    assert s["STORAGES"]["cartridges"]["OPTIONS"] == {"location": "/srv/b"}
    s = load(MNESIO_BLOB_STORAGE_BACKEND="storages.backends.gcloud.GoogleCloudStorage")
    assert s["STORAGES"]["cartridges"] == {"BACKEND": "storages.backends.gcloud.GoogleCloudStorage", "OPTIONS": {}}


def test_s3_settings_build_what_the_tests_moto_bucket_uses(load):
    server = MotoS3.__new__(MotoS3)  # only its settings helpers: no server is started
    server.endpoint_url = "http://127.0.0.1:9999"
    s = load(**server.env("blobs"))
    assert s["STORAGES"]["cartridges"] == server.storage_setting("blobs")


def test_s3_reads_its_secret_from_a_file_and_defaults_to_boto3s_chain(load, tmp_path):
    secret = tmp_path / "s3-secret"
    secret.write_text("from-a-file\n")
    options = load(MNESIO_BLOB_STORAGE="s3", MNESIO_S3_BUCKET="b", MNESIO_S3_ACCESS_KEY_ID="id",
                   MNESIO_S3_SECRET_ACCESS_KEY_FILE=str(secret))["STORAGES"]["cartridges"]["OPTIONS"]
    assert options["secret_key"] == "from-a-file" and options["access_key"] == "id"
    options = load(MNESIO_BLOB_STORAGE="s3", MNESIO_S3_BUCKET="b")["STORAGES"]["cartridges"]["OPTIONS"]
    assert options["access_key"] is None and options["secret_key"] is None and options["endpoint_url"] is None
    assert options["file_overwrite"] is False and options["default_acl"] is None


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"MNESIO_BLOB_STORAGE": "gcs"}, "`MNESIO_BLOB_STORAGE` has to be one of ['local', 's3'] but got 'gcs'"),
        ({"MNESIO_BLOB_STORAGE": "s3"}, "`MNESIO_S3_BUCKET` must be set when `MNESIO_BLOB_STORAGE` is 's3'"),
        ({"MNESIO_BLOB_STORAGE": "s3", "MNESIO_S3_BUCKET": "b", "MNESIO_BLOB_STORAGE_BACKEND": "x.Y"},
         "set either `MNESIO_BLOB_STORAGE=s3` or `MNESIO_BLOB_STORAGE_BACKEND`, not both"),
        ({"MNESIO_BLOB_STORAGE": "s3", "MNESIO_S3_BUCKET": "b", "MNESIO_S3_ADDRESSING_STYLE": "dns"},
         "`MNESIO_S3_ADDRESSING_STYLE` has to be one of ['auto', 'path', 'virtual'] but got 'dns'"),
    ],
)
def test_bad_blob_storage_settings_stop_the_process_naming_the_variable(load, variables, message):
    with pytest.raises(ImproperlyConfigured) as exc:
        load(**variables)
    assert str(exc.value) == message
