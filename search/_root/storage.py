"""Whole-file reads and atomic writes on a local path or a URI (``s3://``, ``gs://``, ``file://``, ...).

A write is all or nothing: a reader sees the old file or the new one, never part of one. Locally the
bytes go to a hidden temp file in the target's folder (``.<name>.<random>.tmp``) that ``os.replace``
then renames over the target; the temp file is removed on any failure. On an object store one PUT
is already atomic. Every file the package writes (records, scheduler state, checkpoints, Parquet,
report pages) goes through ``write_bytes``, or ``append_bytes`` for a log that only grows: appended
in place where the filesystem can append (local), replaced whole and atomically where it cannot
(object stores). ``read_many`` reads a folder's worth of files: in turn locally (a thread pool does
not beat one thread at page-cache speed on two cores), through a thread pool on a remote
filesystem, where each read waits on the network.
"""
from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pyarrow.fs as pafs

try:  # records are float-heavy JSON: orjson parses them several times faster than json
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover
    _fast_loads = None

__all__ = [
    "open_location", "write_bytes", "append_bytes", "can_append", "read_bytes", "list_files", "read_many",
    "write_json", "read_json", "loads_json", "exists", "remove_tree", "sizes_by_entry",
]

REMOTE_READ_THREADS = 16  # concurrent reads on a remote filesystem (each one mostly waits)
_FIRST_READ = 1 << 16  # bytes asked of a local file's first read (below malloc's mmap threshold)


def open_location(uri_or_path) -> tuple[pafs.FileSystem, str]:
    """Local path or URI -> (filesystem, path inside it); local paths are made absolute."""
    text = os.fspath(uri_or_path)
    if "://" in text:
        fs, path = pafs.FileSystem.from_uri(text)
        return fs, path.rstrip("/") or "/"
    return pafs.LocalFileSystem(), os.path.abspath(text)


def exists(uri) -> bool:
    """Is there a file or folder at ``uri``? (OSError when the storage cannot be reached.)"""
    fs, path = open_location(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def remove_tree(uri) -> None:
    """Remove the folder at ``uri`` (on an object store: every object under its prefix)."""
    fs, path = open_location(uri)
    fs.delete_dir(path)


def write_bytes(uri, data) -> None:
    """Replace the file at ``uri`` with ``data`` (bytes or any buffer: memoryview, pyarrow.Buffer)
    atomically, creating its parent folders."""
    fs, path = open_location(uri)
    if isinstance(fs, pafs.LocalFileSystem):
        _write_local(path, data)
        return
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    if parent:
        fs.create_dir(parent, recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(data)


def _write_local(path: str, data: bytes) -> None:
    folder, name = os.path.split(path)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        # O_EXCL: never write through a name someone else holds; 0o666 lets the umask decide, as open() does.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def can_append(fs: pafs.FileSystem) -> bool:
    """Whether files on ``fs`` are appended in place (local) rather than replaced whole (object stores)."""
    return isinstance(fs, pafs.LocalFileSystem)


def append_bytes(uri, data: bytes, whole: Callable[[], bytes]) -> None:
    """Add ``data`` at the end of the existing file at ``uri``. Locally one ``O_APPEND`` write (a
    reader sees the file without the new bytes or with them; a crash mid-write can leave a part of
    them, which a reader of such a log must recognise by its missing final newline). Where the
    filesystem cannot append, and locally when the file is missing, the file is replaced atomically
    by ``whole()``: its complete new content, old bytes and ``data`` together."""
    fs, path = open_location(uri)
    if can_append(fs):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        except FileNotFoundError:
            pass
        else:
            try:
                view = memoryview(data)
                while view:  # one write() unless the kernel takes less
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            return
    write_bytes(uri, whole())


def read_bytes(uri) -> bytes:
    """The whole file at ``uri``; FileNotFoundError when there is none."""
    fs, path = open_location(uri)
    with fs.open_input_stream(path) as f:
        return f.read()


def list_files(fs: pafs.FileSystem, folder: str) -> list[str]:
    """Names of the plain files directly in ``folder`` (a path inside ``fs``); [] when it does not exist."""
    if can_append(fs):  # local: scandir gives entry types without a stat per file
        try:
            with os.scandir(folder) as it:
                return [e.name for e in it if e.is_file()]  # a link to a file counts, as pyarrow sees it
        except (FileNotFoundError, NotADirectoryError):
            return []
    infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    return [i.base_name for i in infos if i.type == pafs.FileType.File]


def read_many(fs: pafs.FileSystem, paths: list[str]) -> list[bytes | None | OSError]:
    """The whole content of each file (paths inside ``fs``), in order: bytes, None for a file that
    does not exist, or the OSError that reading it raised."""
    if can_append(fs):  # local
        return [_read_local(p) for p in paths]
    with ThreadPoolExecutor(min(REMOTE_READ_THREADS, max(1, len(paths)))) as pool:
        return list(pool.map(lambda p: _read_remote(fs, p), paths))


def _read_local(path: str) -> bytes | None | OSError:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc
    try:
        # Records and epochs files are a few kB: one read, no fstat. A regular file reads short only at its end.
        data = os.read(fd, _FIRST_READ)
        if len(data) < _FIRST_READ:
            return data
        chunks = [data]
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        return exc
    finally:
        os.close(fd)


def _read_remote(fs: pafs.FileSystem, path: str) -> bytes | None | OSError:
    try:
        with fs.open_input_stream(path) as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc


def sizes_by_entry(uri) -> dict[str, int]:
    """Bytes of the files under the folder at ``uri``, summed per entry directly in it (a file: its
    own size; a folder: everything below it); {} when there is no such folder. Locally a walk of
    lstat calls (links are not followed); on an object store one recursive listing."""
    fs, root = open_location(uri)
    out: dict[str, int] = {}
    if can_append(fs):  # local
        try:
            entries = list(os.scandir(root))
        except (FileNotFoundError, NotADirectoryError):
            return out
        for entry in entries:  # a file removed while this walks (a running campaign prunes) counts 0
            paths = ([os.path.join(d, f) for d, _, files in os.walk(entry.path) for f in files]
                     if entry.is_dir(follow_symlinks=False) else [entry.path])
            out[entry.name] = sum(map(_local_size, paths))
        return out
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type == pafs.FileType.File:
            name = info.path[len(root):].lstrip("/").split("/", 1)[0]
            out[name] = out.get(name, 0) + (info.size or 0)
    return out


def _local_size(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return 0


def write_json(uri, obj) -> None:
    """``obj`` as JSON (numpy scalars as numbers, other unknown objects as strings), atomically."""
    write_bytes(uri, json.dumps(obj, indent=1, default=_json_default, allow_nan=True).encode("utf-8"))


def read_json(uri):
    return loads_json(read_bytes(uri))


def loads_json(data: bytes):
    """Parse UTF-8 JSON. Raises ValueError: UnicodeDecodeError (not UTF-8), json.JSONDecodeError (not
    JSON), or a plain ValueError for nesting too deep to parse."""
    if _fast_loads is not None:
        try:
            return _fast_loads(data)
        except ValueError:
            pass  # NaN/Infinity (written by write_json) or bad input: json accepts the first, explains the second
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


def _json_default(obj):
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)
