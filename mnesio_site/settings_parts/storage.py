"""STORAGES["cartridges"]: where cartridge blobs live (local files, an S3 bucket, or a named Django storage class).

Blobs go through Django's storage API (cartridges/storage.py): local files by default; MNESIO_BLOB_STORAGE=s3 puts
them in an S3 bucket (django-storages, cartridges/s3.py) so that a fleet of web and worker hosts shares them;
MNESIO_BLOB_STORAGE_BACKEND names any other Django storage class (no options).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from core.settings_spec import read

FILE_SYSTEM_STORAGE = "django.core.files.storage.FileSystemStorage"


def cartridge_blob_storage(*, storage: str, backend: str, data_dir: Path) -> dict[str, Any]:
    """The cartridges storage for MNESIO_BLOB_STORAGE ``storage`` and MNESIO_BLOB_STORAGE_BACKEND ``backend``."""
    if backend and storage == "s3":
        raise ImproperlyConfigured("set either `MNESIO_BLOB_STORAGE=s3` or `MNESIO_BLOB_STORAGE_BACKEND`, not both")
    if storage == "s3":
        return s3_blob_storage()
    backend = backend or FILE_SYSTEM_STORAGE
    options = {"location": str(read("MNESIO_BLOB_ROOT", default=data_dir / "cartridges"))} if backend == FILE_SYSTEM_STORAGE else {}
    return {"BACKEND": backend, "OPTIONS": options}


def s3_blob_storage() -> dict[str, Any]:
    """The S3 bucket storage: MNESIO_S3_BUCKET (required) and the other S3 variables (docs/configuration.md)."""
    bucket = read("MNESIO_S3_BUCKET")
    if not bucket:
        raise ImproperlyConfigured("`MNESIO_S3_BUCKET` must be set when `MNESIO_BLOB_STORAGE` is 's3'")
    return {
        "BACKEND": "cartridges.s3.CartridgeS3Storage",
        "OPTIONS": {
            "bucket_name": bucket,
            # a key prefix inside the bucket ('' = the bucket's root)
            "location": read("MNESIO_S3_PREFIX").strip("/"),
            # unset: AWS itself; set for MinIO, Ceph, moto (tests) or another S3-compatible service
            "endpoint_url": read("MNESIO_S3_ENDPOINT_URL") or None,
            "region_name": read("MNESIO_S3_REGION") or None,
            # unset: boto3's own chain (AWS_ACCESS_KEY_ID..., an instance or pod role)
            "access_key": read("MNESIO_S3_ACCESS_KEY_ID") or None,
            "secret_key": read("MNESIO_S3_SECRET_ACCESS_KEY") or None,
            # 'path' for most self-hosted S3-compatible servers; unset: boto3 chooses (virtual hosts on AWS)
            "addressing_style": read("MNESIO_S3_ADDRESSING_STYLE"),
            "signature_version": "s3v4",
            "file_overwrite": False,  # a name that exists is never written over (cartridges.storage refuses a rename)
            "default_acl": None,  # the bucket's own policy: blobs are private, never public-read
            "querystring_auth": True,
        },
    }
