"""Cartridge blobs in an S3 bucket (``MNESIO_BLOB_STORAGE=s3``): django-storages' S3Storage, holding the
guarantees the local store gives (cartridges/storage.py relies on them).

- **Atomic write.** A PUT (or a multipart upload) makes the object visible only once complete; incomplete parts
  hold only ciphertext whose key row is dropped with the failed compile, and a bucket lifecycle rule
  (AbortIncompleteMultipartUpload) removes them. Each upload carries a client SHA-256 (``ChecksumAlgorithm``).
- **Never written over.** ``file_overwrite=False``: a name that exists gets another name, which ``blob_write``
  refuses; names are fresh uuid4s anyway.
- **Content hash on read.** ``blob_read`` checks the stored bytes' SHA-256, the GCM tag and the file's SHA-256,
  whatever the backend; a read is one GET into memory, so a failure surfaces in ``open()``.
- **Destruction really deletes.** In a versioned bucket ``delete`` removes every version and delete marker of
  the key, then checks that none is left.
- **Errors.** botocore's exceptions become ``OSError`` (``FileNotFoundError`` for a missing key), which
  cartridges.storage maps to ``BlobUnavailable`` / ``BlobStorageUnavailable`` as for local files.
"""
from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager

from botocore.exceptions import BotoCoreError, ClientError
from django.core.files.base import ContentFile
from storages.backends.s3 import S3Storage
from storages.utils import clean_name

NOT_FOUND_CODES = {"404", "NoSuchKey", "NotFound", "NoSuchVersion"}


@contextmanager
def s3_errors_as_os_errors(name: str) -> Iterator[None]:
    """Turn botocore's errors into OSError; a missing key (not a missing bucket) into FileNotFoundError."""
    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in NOT_FOUND_CODES or (status == 404 and code != "NoSuchBucket"):
            raise FileNotFoundError(errno.ENOENT, f"no object {name!r} in the bucket") from exc
        raise OSError(errno.EIO, f"S3 refused the request ({code or status})") from exc
    except BotoCoreError as exc:
        raise OSError(errno.EIO, f"S3 is unreachable ({type(exc).__name__})") from exc


class CartridgeS3Storage(S3Storage):
    """S3Storage with one-GET reads, checksummed writes, every-version deletes and OSError failures."""

    def _key(self, name: str) -> str:
        return self._normalize_name(clean_name(name))

    @property
    def _client(self):
        return self.connection.meta.client

    def _open(self, name: str, mode: str = "rb") -> ContentFile:
        if set(mode) - {"r", "b"}:
            raise ValueError(f"`mode` has to be 'rb' for cartridge blobs (they are written with save()) but got {mode!r}")
        with s3_errors_as_os_errors(name):
            # ChecksumMode: botocore verifies the body against the checksum stored with the object
            response = self._client.get_object(Bucket=self.bucket_name, Key=self._key(name), ChecksumMode="ENABLED")
            body = response["Body"].read()
        return ContentFile(body, name=name)

    def _get_write_parameters(self, name, content=None):
        params = super()._get_write_parameters(name, content)
        params["ContentType"] = "application/octet-stream"
        params.setdefault("ChecksumAlgorithm", "SHA256")  # S3 refuses an upload whose bytes do not match
        return params

    def _save(self, name, content):
        with s3_errors_as_os_errors(name):
            return super()._save(name, content)

    def exists(self, name: str) -> bool:
        with s3_errors_as_os_errors(name):
            return super().exists(name)

    def size(self, name: str) -> int:
        with s3_errors_as_os_errors(name):
            return super().size(name)

    def delete(self, name: str) -> None:
        """Delete the object and, in a versioned bucket, every earlier version and delete marker of it."""
        key = self._key(name)
        with s3_errors_as_os_errors(name):
            self._client.delete_object(Bucket=self.bucket_name, Key=key)
            left = self._versions(key)
            for version_id in left:
                self._client.delete_object(Bucket=self.bucket_name, Key=key, VersionId=version_id)
            if left and self._versions(key):
                raise OSError(errno.EIO, f"versions of {name!r} are still in the bucket after deleting them")

    def _versions(self, key: str) -> list[str]:
        """Version ids (objects and delete markers) still stored under exactly ``key``."""
        found = []
        for page in self._client.get_paginator("list_object_versions").paginate(Bucket=self.bucket_name, Prefix=key):
            for entry in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]:
                if entry["Key"] == key:
                    found.append(entry["VersionId"])
        return found
