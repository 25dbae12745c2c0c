"""Conditional writes of one small file (the driver lease, search.records.lease) on each kind of storage, so
that of two writers exactly one wins. A store has read() -> (bytes, version) | None, create(data) -> version |
None (None: the file exists), replace(data, version) and delete(version) -> None / False when the file is no
longer at that version.

    storage          create if absent              replace / delete if unchanged since version V
    local, NFS       link(temp, file)              exclusive create (O_EXCL) of `.<file>.<V>.claim`,
                                                   check the file is still V, replace / unlink, unclaim
    s3://            PUT If-None-Match: *          PUT / DELETE If-Match: <ETag V>    (boto3)
    gs://            if_generation_match=0         if_generation_match=<generation V> (google-cloud-storage)

Locally the version is a digest of the bytes. link and O_EXCL are atomic on NFS (v3 and later) as well.
boto3 and google-cloud-storage are imported only for a bucket campaign: reading needs neither (pyarrow).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import time
import uuid
from urllib.parse import parse_qs, urlsplit

import pyarrow.fs as pafs

from qkvsearch.spaces.errors import BadInput
from qkvsearch.storage import open_location


class LeaseStorageError(BadInput):
    """The campaign's storage cannot hold a lease (no conditional write there, or its library missing)."""


class _LocalStore:
    """A lease file on a local or shared (NFS) filesystem; version = a digest of its bytes."""

    def __init__(self, folder: str, name: str, stale_s: float):
        self.folder, self.name, self.stale_s = folder, name, stale_s
        self.path = os.path.join(folder, name)
        self.created: list[str] = []  # folders made for the lease, deepest first (removed on release if empty)

    def read(self) -> tuple[bytes, str] | None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        return data, _digest(data)

    def create(self, data: bytes) -> str | None:
        self._make_folder()
        tmp = self._temp(data)
        try:
            os.link(tmp, self.path)  # atomic create-if-absent, on NFS too; the lease appears complete
        except FileExistsError:
            # NFS: a retransmitted link whose first reply was lost reports EEXIST; the link count tells
            if os.stat(tmp).st_nlink != 2:
                return None
        finally:
            os.unlink(tmp)
        return _digest(data)

    def replace(self, data: bytes, version: str) -> str | None:
        with self._claim(version) as ok:
            if not ok:
                return None
            tmp = self._temp(data)
            try:
                os.replace(tmp, self.path)
            except OSError:
                os.unlink(tmp)
                raise
        return _digest(data)

    def delete(self, version: str) -> bool:
        with self._claim(version) as ok:
            if ok:
                os.unlink(self.path)
        for folder in self.created:  # a lease that was all this driver wrote leaves no folder behind
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        return ok

    @contextlib.contextmanager
    def _claim(self, version: str):
        """Yields True while this process alone may change the lease, and only if it is still ``version``:
        every writer from ``version`` first creates the same claim file, exclusively."""
        claim = os.path.join(self.folder, f".{self.name}.{version}.claim")
        try:
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            self._drop_if_stale(claim)  # a writer killed between claim and change leaves it behind
            yield False
            return
        except FileNotFoundError:  # the campaign folder is gone
            yield False
            return
        os.close(fd)
        try:
            now = self.read()
            yield now is not None and now[1] == version
        finally:
            with contextlib.suppress(OSError):
                os.unlink(claim)

    def _drop_if_stale(self, claim: str) -> None:
        with contextlib.suppress(OSError):
            if time.time() - os.stat(claim).st_mtime > self.stale_s:
                os.unlink(claim)

    def _temp(self, data: bytes) -> str:
        tmp = os.path.join(self.folder, f".{self.name}.{uuid.uuid4().hex[:12]}.tmp")
        with open(tmp, "xb") as f:
            f.write(data)
        return tmp

    def _make_folder(self) -> None:
        missing, here = [], self.folder
        while not os.path.exists(here) and os.path.dirname(here) != here:
            missing.append(here)
            here = os.path.dirname(here)
        os.makedirs(self.folder, exist_ok=True)
        self.created = self.created or missing


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:20]


class _S3Store:
    """The lease as one S3 object; version = its ETag. Conditional PUT/DELETE need boto3."""

    def __init__(self, uri: str, fs: pafs.S3FileSystem, path: str, name: str):
        try:
            import boto3
            from botocore.exceptions import ClientError
        except ImportError:
            raise LeaseStorageError(
                f"storage: a campaign in a bucket ({uri}) is held by a lease written with S3 conditional "
                f"writes, which need boto3, not installed here; install it with `pip install boto3`") from None
        self._error = ClientError
        self.bucket, _, key = path.partition("/")
        self.key = f"{key}/{name}" if key else name
        query = parse_qs(urlsplit(uri).query)
        endpoint = query.get("endpoint_override", [None])[0]
        if endpoint and "://" not in endpoint:
            endpoint = f"{query.get('scheme', ['https'])[0]}://{endpoint}"
        self.client = boto3.client("s3", region_name=fs.region or None, endpoint_url=endpoint)
        put = self.client.meta.service_model.operation_model("PutObject").input_shape.members
        if not {"IfMatch", "IfNoneMatch"} <= set(put):  # conditional writes came to S3 (and boto3) in 2024
            raise LeaseStorageError(
                f"storage: a campaign in a bucket ({uri}) needs S3 conditional writes, which boto3 "
                f"{boto3.__version__} cannot send; upgrade it with `pip install -U boto3`")

    def read(self) -> tuple[bytes, str] | None:
        try:
            got = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except self._error as exc:
            if self._code(exc) in ("NoSuchKey", "404"):
                return None
            raise
        return got["Body"].read(), got["ETag"]

    def create(self, data: bytes) -> str | None:
        return self._put(data, IfNoneMatch="*")

    def replace(self, data: bytes, version: str) -> str | None:
        return self._put(data, IfMatch=version)

    def delete(self, version: str) -> bool:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=version)
        except self._error as exc:
            if self._lost(exc):
                return False
            raise
        return True

    def _put(self, data: bytes, **condition) -> str | None:
        try:
            return self.client.put_object(Bucket=self.bucket, Key=self.key, Body=data, **condition)["ETag"]
        except self._error as exc:
            if self._lost(exc):
                return None
            raise

    def _lost(self, exc) -> bool:
        # 412: the condition failed; 409: a concurrent conditional write won; 404: the lease is gone
        return self._code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409",
                                   "NoSuchKey", "404")

    @staticmethod
    def _code(exc) -> str:
        return str(exc.response.get("Error", {}).get("Code", ""))


class _GCSStore:
    """The lease as one GCS object; version = its generation (google-cloud-storage's preconditions)."""

    def __init__(self, uri: str, path: str, name: str):
        try:
            from google.api_core import exceptions
            from google.cloud import storage
        except ImportError:
            raise LeaseStorageError(
                f"storage: a campaign in a bucket ({uri}) is held by a lease written with GCS generation "
                f"preconditions, which need google-cloud-storage, not installed here; install it with "
                f"`pip install google-cloud-storage`") from None
        self._lost = (exceptions.PreconditionFailed, exceptions.NotFound)
        bucket, _, key = path.partition("/")
        self.blob = storage.Client().bucket(bucket).blob(f"{key}/{name}" if key else name)

    def read(self) -> tuple[bytes, str] | None:
        try:
            data = self.blob.download_as_bytes()
        except self._lost:
            return None
        return data, str(self.blob.generation)

    def create(self, data: bytes) -> str | None:
        return self._upload(data, 0)

    def replace(self, data: bytes, version: str) -> str | None:
        return self._upload(data, int(version))

    def delete(self, version: str) -> bool:
        try:
            self.blob.delete(if_generation_match=int(version))
        except self._lost:
            return False
        return True

    def _upload(self, data: bytes, generation: int) -> str | None:
        try:
            self.blob.upload_from_string(data, if_generation_match=generation)
        except self._lost:
            return None
        return str(self.blob.generation)


def open_store(exp: str, name: str, stale_s: float):
    """The store of the file ``name`` in the campaign folder ``exp`` (local path or URI). stale_s: a claim
    older than this was left by a writer that died (local stores)."""
    fs, path = open_location(exp)
    if isinstance(fs, pafs.LocalFileSystem):
        return _LocalStore(path, name, stale_s)
    if isinstance(fs, pafs.S3FileSystem):
        return _S3Store(exp, fs, path, name)
    if isinstance(fs, pafs.GcsFileSystem):
        return _GCSStore(exp, path, name)
    raise LeaseStorageError(f"storage: expected a local path, s3:// or gs:// (storage that can hold a driver "
                            f"lease with a conditional write), given {exp} ({fs.type_name})")
