"""A warehouse's location: a local folder or a URI on an object store.

Every file the engine keeps (Delta tables, staged DML, a snapshot job's
checkpoints, meta-store pointer) is named by a URI string under the warehouse and
reached through this class: pyarrow's filesystem for files, delta-rs (with the same
storage options) for Delta tables. Nothing else in the engine touches the local
disk for warehouse files, so the same code serves ``/data/wh``, ``file:///data/wh``
and ``s3://bucket/wh``.

Invariants:
- ``Warehouse(location)`` refuses an unknown or unusable scheme with a
  ``SparkfillError`` before anything is created.
- A local warehouse's URIs are absolute paths (what Spark's own Parquet reader and
  writer take); an object store's are ``scheme://bucket/...`` (read and written by
  the executors through pyarrow, ``object_files``).
- ``write_text`` is atomic: a reader sees the old content or the new, never part.
"""

from __future__ import annotations

import builtins
import os
import re
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable

from ..errors import InvalidOption, SparkfillError
from .object_files import filesystem_for

__all__ = ["Warehouse", "OBJECT_STORE_SCHEMES"]

#: schemes served through pyarrow's filesystems and delta-rs's object stores
OBJECT_STORE_SCHEMES = ("s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "azure")
#: the environment an S3 warehouse's storage options are completed from
_S3_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
           "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP")


class Warehouse:
    """Where a warehouse's files live, and the file operations the engine needs."""

    def __init__(self, location: str | Path,
                 storage_options: dict[str, str] | None = None) -> None:
        if not isinstance(location, str | os.PathLike) or isinstance(location, bytes):
            raise SparkfillError(f"a warehouse is a path or a URI (a string), not "
                                 f"{type(location).__name__} {_shown(location)}")
        text = str(os.fspath(location))
        if not text.strip() or "\x00" in text:
            raise SparkfillError(f"warehouse {text!r}: not a path or a URI")
        try:
            text.encode("utf-8")  # a lone surrogate names no file
        except UnicodeEncodeError:
            raise SparkfillError(f"warehouse {text!r}: not a path or a URI (it is not "
                                 "valid Unicode text)") from None
        if storage_options is not None and not (
                isinstance(storage_options, dict)
                and all(isinstance(k, str) and isinstance(v, str)
                        for k, v in storage_options.items())):
            raise InvalidOption(f"storage_options is a dict of strings (delta-rs's keys, e.g. "
                                f"AWS_ENDPOINT_URL), not {_shown(storage_options)}")
        m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", text)
        self.storage_options: dict[str, str] = dict(storage_options or {})
        if m is None or m.group(1).lower() == "file":
            local = Path(text if m is None else (m.group(2) or "/")).resolve()
            self.scheme = "file"
            self.local_path: Path | None = local
            self.uri = str(local)
            self.fs: pafs.FileSystem = pafs.LocalFileSystem()
            return
        scheme, rest = m.group(1).lower(), m.group(2).rstrip("/")
        if scheme not in OBJECT_STORE_SCHEMES:
            known = ", ".join(s + "://" for s in OBJECT_STORE_SCHEMES)
            raise SparkfillError(
                f"warehouse {text!r}: unknown scheme {scheme}://; a warehouse is a local path, "
                f"file://..., or an object store ({known})")
        if not rest or rest.startswith("/"):
            raise SparkfillError(f"warehouse {text!r}: no bucket or container named after "
                                 f"{scheme}://")
        self.scheme = scheme
        self.local_path = None
        self.uri = f"{scheme}://{rest}"
        if scheme in ("s3", "s3a"):
            # the driver's AWS_* settings go with the jobs to the executors, whose Python
            # workers may not share the driver's environment (explicit options win)
            given = {k.upper() for k in self.storage_options}
            for key in _S3_ENV:
                if key not in given and os.environ.get(key):
                    self.storage_options[key] = os.environ[key]
            # one writer (the engine's lock) commits to each table: no rename lock needed
            self.storage_options.setdefault("AWS_S3_ALLOW_UNSAFE_RENAME", "true")
            if _option(self.storage_options, "AWS_ENDPOINT_URL", "").startswith("http://"):
                self.storage_options.setdefault("AWS_ALLOW_HTTP", "true")
        try:
            self.fs, _ = filesystem_for(self.uri, self.storage_options)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds
            raise SparkfillError(f"warehouse {text!r}: cannot open its filesystem: {exc}") from None

    def check_reachable(self) -> None:
        """Raise ``SparkfillError`` unless the warehouse's bucket (container) can be
        reached; a local folder always can (it is created on first use)."""
        if self.is_local:
            return
        bucket = self.fs_path(self.uri).split("/", 1)[0]
        try:
            info = self.fs.get_file_info(bucket)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises OSError and others
            raise SparkfillError(f"warehouse {self.uri}: cannot reach bucket {bucket!r}: "
                                 f"{' '.join(str(exc).split())}") from None
        if info.type == pafs.FileType.NotFound:
            raise SparkfillError(f"warehouse {self.uri}: bucket {bucket!r} does not exist "
                                 "(sparkfill does not create buckets)")

    def options_for(self, uri: str) -> dict[str, str] | None:
        """The storage options to open another location ``uri`` with (a sink's table,
        a source's folder): this warehouse's when ``uri`` is on the same kind of
        object store (its endpoint and credentials are the likely ones), else None:
        the environment's (a ``Warehouse`` of ``uri`` completes them from it)."""
        if self.is_local or "://" not in uri:
            return None
        scheme = uri.split("://", 1)[0].lower()
        family = {"s3a": "s3", "gcs": "gs", "abfs": "abfss", "az": "azure"}
        if family.get(scheme, scheme) != family.get(self.scheme, self.scheme):
            return None
        return dict(self.storage_options)

    @property
    def is_local(self) -> bool:
        return self.local_path is not None

    def __str__(self) -> str:
        return self.uri

    # --- names ----------------------------------------------------------------------------

    def join(self, *parts: str) -> str:
        """The URI of ``parts`` under the warehouse."""
        return "/".join([self.uri.rstrip("/"), *[p.strip("/") for p in parts if p]])

    def fs_path(self, uri: str) -> str:
        """``uri`` as a path of ``self.fs``."""
        uri = str(uri)
        if self.is_local:
            return uri[len("file://"):] if uri.startswith("file://") else uri
        return uri.split("://", 1)[1] if "://" in uri else uri

    @staticmethod
    def name_of(uri: str) -> str:
        return str(uri).rstrip("/").rsplit("/", 1)[-1]

    # --- files ----------------------------------------------------------------------------

    def exists(self, uri: str) -> bool:
        return bool(self.fs.get_file_info(self.fs_path(uri)).type != pafs.FileType.NotFound)

    def is_file(self, uri: str) -> bool:
        return bool(self.fs.get_file_info(self.fs_path(uri)).type == pafs.FileType.File)

    def makedirs(self, uri: str) -> None:
        self.fs.create_dir(self.fs_path(uri), recursive=True)

    def rmtree(self, uri: str) -> None:
        """Remove a directory and everything below it, or a file; nothing if absent."""
        path = self.fs_path(uri)
        info = self.fs.get_file_info(path)
        try:
            if info.type == pafs.FileType.Directory:
                self.fs.delete_dir(path)
            elif info.type == pafs.FileType.File:
                self.fs.delete_file(path)
            elif not self.is_local:  # an object store's "directory" may be a bare prefix
                self.fs.delete_dir_contents(path, missing_dir_ok=True)
        except FileNotFoundError:
            pass

    def list(self, uri: str) -> list[str]:
        """The URIs of the entries right under ``uri`` (none when it does not exist)."""
        path = self.fs_path(uri)
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(f"{uri.rstrip('/')}/{info.base_name}" for info in infos)

    def part_files(self, uri: str) -> builtins.list[str]:
        """The ``part-*.parquet`` files right under ``uri``: what a Spark write (or
        ``object_files.parquet_writer``) left there as its data, sorted."""
        return [u for u in self.list(uri)
                if Warehouse.name_of(u).startswith("part-") and u.endswith(".parquet")]

    def size(self, uri: str) -> int:
        return int(self.fs.get_file_info(self.fs_path(uri)).size or 0)

    def file_size(self, uri: str) -> int | None:
        """The size of the file ``uri``; None when there is no such file."""
        if self.local_path is not None:
            try:
                st = os.stat(self.fs_path(uri))
            except (FileNotFoundError, NotADirectoryError):
                return None
            return st.st_size if stat.S_ISREG(st.st_mode) else None
        info = self.fs.get_file_info(self.fs_path(uri))
        return int(info.size or 0) if info.type == pafs.FileType.File else None

    def is_parquet_file(self, uri: str, size: int) -> bool:
        """Whether the file of ``size`` bytes ends as a whole Parquet file does (its
        footer's magic bytes): a file cut short does not."""
        if size < 12:
            return False
        try:
            with self.fs.open_input_file(self.fs_path(uri)) as fh:
                return bytes(fh.read_at(4, size - 4)) == b"PAR1"
        except OSError:
            return False

    def read_text(self, uri: str) -> str | None:
        """The file's text; None when it does not exist."""
        try:
            with self.fs.open_input_stream(self.fs_path(uri)) as fh:
                return bytes(fh.read()).decode()
        except FileNotFoundError:
            return None
        except OSError:
            if not self.is_file(uri):
                return None
            raise

    def write_text(self, uri: str, text: str) -> None:
        """Replace the file's text atomically (a local file through a renamed temporary
        file, fsynced; an object-store PUT is atomic)."""
        if self.local_path is None:
            with self.fs.open_output_stream(self.fs_path(uri)) as fh:
                fh.write(text.encode())
            return
        path = Path(self.fs_path(uri))
        os.replace(_synced_temp(path, text), path)

    def create_text(self, uri: str, text: str) -> bool:
        """Write the file unless it exists; whether this call wrote it. Locally of two
        callers at once exactly one wins (a hard link); on an object store the caller
        serializes creators (the meta store's lock)."""
        if self.local_path is None:
            if self.exists(uri):
                return False
            self.write_text(uri, text)
            return True
        path = Path(self.fs_path(uri))
        tmp = _synced_temp(path, text)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink()

    def link_or_copy(self, src: str, dst: str) -> None:
        """``dst`` holds ``src``'s bytes: a hard link where the filesystem can, else a
        copy (server side on an object store)."""
        if self.local_path is not None:
            try:
                os.link(self.fs_path(src), self.fs_path(dst))
                return
            except OSError:
                shutil.copyfile(self.fs_path(src), self.fs_path(dst))
                return
        self.fs.copy_file(self.fs_path(src), self.fs_path(dst))

    # --- Parquet on the driver --------------------------------------------------------------

    def write_parquet(self, table: pa.Table, uri: str, fsync: bool = False) -> int:
        """Write ``table`` as one snappy Parquet file; its size in bytes."""
        path = self.fs_path(uri)
        if self.local_path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, path, compression="snappy")
            if fsync:
                with open(path, "rb+") as fh:
                    os.fsync(fh.fileno())
            return os.path.getsize(path)
        pq.write_table(table, path, filesystem=self.fs, compression="snappy")
        return self.size(uri)

    def read_parquet(self, uri: str, filters: builtins.list[tuple[str, str, Any]] | None = None,
                     ) -> pa.Table:
        """One Parquet file's rows; ``filters`` (pyarrow's: ``(column, op, value)``,
        all of them hold): only those rows, and of the file only the row groups
        whose statistics can hold one."""
        if self.local_path is not None:
            return pq.read_table(self.fs_path(uri), filters=filters)
        return pq.read_table(self.fs_path(uri), filesystem=self.fs, filters=filters)

    def read_row_groups(self, uri: str, groups: builtins.list[int],
                        metadata: pq.FileMetaData | None = None) -> pa.Table:
        """The rows of one Parquet file's row groups ``groups``; ``metadata``: the
        file's footer as read before (a file that never changes), not parsed again."""
        with self.fs.open_input_file(self.fs_path(uri)) as fh:
            return pq.ParquetFile(fh, metadata=metadata).read_row_groups(groups)

    def parquet_metadata(self, uri: str) -> pq.FileMetaData:
        with self.fs.open_input_file(self.fs_path(uri)) as fh:
            return pq.ParquetFile(fh).metadata

    def parquet_schema(self, uri: str) -> pa.Schema:
        with self.fs.open_input_file(self.fs_path(uri)) as fh:
            return pq.read_schema(fh)

    # --- Delta tables ---------------------------------------------------------------------

    def delta(self, uri: str, version: int | None = None) -> DeltaTable:
        return DeltaTable(uri, version=version, storage_options=self.storage_options or None)

    def create_delta(self, uri: str, schema: pa.Schema) -> None:
        DeltaTable.create(uri, schema, mode="error",
                          storage_options=self.storage_options or None)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


def _option(options: dict[str, str], key: str, default: str) -> str:
    for k, v in options.items():
        if k.upper() == key:
            return v
    return os.environ.get(key, default)


def _synced_temp(path: Path, text: str) -> Path:
    """``text`` written and fsynced to a new temporary file beside ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    return tmp
