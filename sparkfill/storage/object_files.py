"""Parquet files on any filesystem pyarrow knows, read and written by Spark's executors.

Spark reads and writes a local (or mounted) warehouse with its own Parquet source;
an object store (``s3://``, ``gs://``, ``abfss://``, ...) needs Hadoop connector jars
that a Spark install may lack. This module is the path that needs none: executors
open the files through pyarrow's filesystems —

- ``ArrowParquetSource`` (Spark's Python data source API) reads a list of files,
  one input partition per file, as Arrow record batches;
- ``ArrowTextSource`` reads whole text files, one row (name, text) per file (a
  file source's landed files on an object store);
- ``parquet_writer`` is a ``mapInArrow`` function: each partition becomes one
  Parquet file, and the function returns its path, size and Delta statistics
  (so the driver never lists, stats or reads what was written);
- ``keyed_copy_writer`` and ``keyed_reader`` are the ``mapInArrow`` functions of a
  base file's *keyed copy*: its rows sorted by key in small row groups, written
  beside it, from which a lookup of a few keys reads only the row groups whose key
  range holds one (the driver picks them from the copy's footer).

Invariant: this module imports nothing of sparkfill at its top, so it ships to the
executors by value (``ship_by_value``): a cluster or a Spark Connect server needs
pyarrow, not sparkfill, on its workers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

__all__ = ["SOURCE_NAME", "TEXT_SOURCE_NAME", "TEXT_SCHEMA", "WRITTEN_SCHEMA",
           "KEYED_WRITTEN_SCHEMA", "filesystem_for", "parquet_writer", "keyed_copy_writer",
           "keyed_reader", "arrow_file_stats", "ArrowParquetSource",
           "ArrowTextSource", "ship_by_value"]

#: the names the data sources are registered under
SOURCE_NAME = "sparkfill_parquet"
TEXT_SOURCE_NAME = "sparkfill_text"
#: what ``ArrowTextSource`` returns per file: its name (the last part of its URI) and text
TEXT_SCHEMA = "file string, value string"
#: what ``parquet_writer`` returns per file written
WRITTEN_SCHEMA = "path string, size long, rows long, stats string"
#: what ``keyed_copy_writer`` returns per copy written
KEYED_WRITTEN_SCHEMA = "uri string, rows long"

# delta-rs storage-option keys (and their environment names) -> pyarrow S3FileSystem
_S3_OPTIONS = {
    "aws_access_key_id": "access_key",
    "aws_secret_access_key": "secret_key",
    "aws_session_token": "session_token",
    "aws_region": "region",
    "aws_endpoint_url": "endpoint_override",
    "aws_endpoint": "endpoint_override",
}


def filesystem_for(uri: str, storage_options: dict[str, str] | None = None) -> tuple[Any, str]:
    """The pyarrow filesystem of ``uri`` and the path inside it. ``storage_options``
    (delta-rs style keys, e.g. ``AWS_ENDPOINT_URL``) configure an S3 filesystem; the
    environment does the rest, as it does for delta-rs."""
    import pyarrow.fs as pafs

    options = {k.lower(): v for k, v in (storage_options or {}).items()}
    if uri.startswith(("s3://", "s3a://")):
        kwargs: dict[str, Any] = {}
        for key, name in _S3_OPTIONS.items():
            if options.get(key):
                kwargs[name] = options[key]
        endpoint = kwargs.get("endpoint_override")
        if endpoint is not None and "://" in endpoint:
            scheme, _, rest = endpoint.partition("://")
            kwargs["scheme"], kwargs["endpoint_override"] = scheme, rest
        # built directly (not from_uri, which asks the network for the bucket's region):
        # the region comes from AWS_REGION, the options or the AWS config
        return pafs.S3FileSystem(**kwargs), uri.split("://", 1)[1].rstrip("/")
    return pafs.FileSystem.from_uri(uri)


def arrow_file_stats(table: pa.Table | pa.RecordBatch, columns: Sequence[str]) -> dict[str, Any]:
    """Delta statistics of rows about to be written: the row count and, for integer
    and string columns of ``columns``, min, max and null count."""
    import pyarrow.compute as pc

    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    names = set(table.schema.names)
    for col in columns:
        if col not in names:
            continue
        array = table[col]
        if not (pa.types.is_integer(array.type) or pa.types.is_string(array.type)
                or pa.types.is_large_string(array.type)):
            continue
        mm = pc.min_max(array).as_py()
        if mm["min"] is None:
            continue
        mins[col], maxs[col], nulls[col] = mm["min"], mm["max"], array.null_count
    return {"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs,
            "nullCount": nulls}


def parquet_writer(dir_uri: str, storage_options: dict[str, str] | None,
                   stats_columns: Sequence[str], target_schema: pa.Schema,
                   ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function writing each partition's rows (in their order) as one
    snappy Parquet file under ``dir_uri``; yields one row per file written (nothing
    for an empty partition): its full URI, size in bytes, rows and statistics."""
    columns = list(stats_columns)

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import uuid

        import pyarrow.parquet as pq

        collected = list(batches)
        if not collected or not sum(b.num_rows for b in collected):
            return
        rows = pa.Table.from_batches(collected)
        rows = rows.cast(target_schema)
        fs, base = filesystem_for(dir_uri, storage_options)
        name = f"part-{uuid.uuid4().hex}.snappy.parquet"
        fs.create_dir(base, recursive=True)
        path = f"{base}/{name}"
        pq.write_table(rows, path, filesystem=fs, compression="snappy")
        size = fs.get_file_info(path).size
        stats = arrow_file_stats(rows, columns)
        yield pa.RecordBatch.from_pylist(
            [{"path": f"{dir_uri.rstrip('/')}/{name}", "size": size, "rows": rows.num_rows,
              "stats": json.dumps(stats, default=str)}],
            schema=pa.schema([("path", pa.string()), ("size", pa.int64()),
                              ("rows", pa.int64()), ("stats", pa.string())]))

    return write


def keyed_copy_writer(storage_options: dict[str, str] | None, key_column: str,
                      group_rows: int,
                      ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function over work rows ``(src, dst)``: each Parquet file
    ``src`` rewritten as ``dst`` with its rows sorted by ``key_column``, in row groups
    of ``group_rows`` rows (so each row group's statistics bound a narrow key range);
    yields ``(dst, rows)`` per copy."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        out_schema = pa.schema([("uri", pa.string()), ("rows", pa.int64())])
        for batch in batches:
            for src, dst in zip(batch.column("src").to_pylist(),
                                batch.column("dst").to_pylist(), strict=True):
                fs, path = filesystem_for(src, storage_options)
                with fs.open_input_file(path) as fh:
                    rows = pq.read_table(fh)
                rows = rows.take(_sort_indices(rows.column(key_column)))
                out_fs, out = filesystem_for(dst, storage_options)
                # no dictionaries, statistics of the key only: a third of the write's
                # time at row groups this small (bench/RESULTS.md "Stop 53")
                pq.write_table(rows, out, filesystem=out_fs, row_group_size=group_rows,
                               compression="snappy", use_dictionary=False,
                               write_statistics=[key_column])
                yield pa.RecordBatch.from_pylist([{"uri": dst, "rows": rows.num_rows}],
                                                 schema=out_schema)

    return write


def _sort_indices(column: Any) -> Any:
    """The positions of ``column``'s values in ascending order (numpy's sort for an
    integer column without nulls: about 2.5x pyarrow's)."""
    import pyarrow.compute as pc

    if pa.types.is_integer(column.type) and not column.null_count:
        import numpy as np

        return pa.array(np.argsort(column.to_numpy(), kind="stable"))
    return pc.sort_indices(column)


def keyed_reader(storage_options: dict[str, str] | None, key_column: str,
                 target_schema: pa.Schema,
                 ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function over work rows ``(uri, groups, keys)``: the rows of
    the keyed copy ``uri`` in its row groups ``groups`` whose ``key_column`` is one of
    ``keys`` (a JSON list), as ``target_schema`` (a column the copy lacks — added to
    its relation after it was written — is NULL)."""

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        for batch in batches:
            for uri, groups, keys in zip(batch.column("uri").to_pylist(),
                                         batch.column("groups").to_pylist(),
                                         batch.column("keys").to_pylist(), strict=True):
                fs, path = filesystem_for(uri, storage_options)
                with fs.open_input_file(path) as fh:
                    parquet = pq.ParquetFile(fh)
                    held = set(parquet.schema_arrow.names)
                    rows = parquet.read_row_groups(
                        groups, columns=[f.name for f in target_schema if f.name in held])
                column = rows.column(key_column)
                rows = rows.filter(pc.is_in(column, value_set=pa.array(
                    json.loads(keys), type=column.type)))
                if rows.num_rows:
                    yield from conformed(rows, target_schema, held).to_batches()

    return read


def conformed(rows: Any, target: pa.Schema, held: set[str]) -> Any:
    """``rows`` (a table or a record batch read from a file whose columns are
    ``held``) as exactly ``target``: each column cast to its type, and NULL where the
    file lacks it (added to its relation after the file was written)."""
    return type(rows).from_arrays(
        [rows.column(f.name).cast(f.type) if f.name in held else pa.nulls(rows.num_rows, f.type)
         for f in target], schema=target)


try:  # Spark's Python data source API (pyspark >= 4.0)
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
except ImportError:  # pragma: no cover - sparkfill needs pyspark 4
    DataSource = object  # type: ignore[assignment,misc]
    DataSourceReader = object  # type: ignore[assignment,misc]
    InputPartition = object  # type: ignore[assignment,misc]


def _storage_options(options: Mapping[str, str]) -> dict[str, str]:
    """The storage options a reader was given, one ``storage.<key>`` option per setting
    (so Spark's redaction hides the secret ones in plans)."""
    return {k[len("storage."):]: v for k, v in options.items()
            if k.lower().startswith("storage.")}


class _FilesReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, schema: Any, options: Mapping[str, str]) -> None:
        self.uris: list[str] = json.loads(options["uris"])
        self.storage = _storage_options(options)
        self.columns: list[str] = [f.name for f in schema.fields]
        self.schema = schema

    def partitions(self) -> list[Any]:
        return [InputPartition(uri) for uri in self.uris]

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq
        from pyspark.sql.pandas.types import to_arrow_schema

        # exactly the requested schema (Spark checks it, nullability included)
        target = to_arrow_schema(self.schema)
        fs, path = filesystem_for(partition.value, self.storage)
        with fs.open_input_file(path) as fh:
            parquet = pq.ParquetFile(fh)
            # a column the file lacks (added to its relation after it was written) is NULL
            held = set(parquet.schema_arrow.names)
            present = [c for c in self.columns if c in held]
            for batch in parquet.iter_batches(columns=present):
                yield batch if batch.schema == target else conformed(batch, target, held)


class _TextReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: Mapping[str, str]) -> None:
        self.uris: list[str] = json.loads(options["uris"])
        self.storage = _storage_options(options)

    def partitions(self) -> list[Any]:
        return [InputPartition(uri) for uri in self.uris]

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        fs, path = filesystem_for(partition.value, self.storage)
        with fs.open_input_stream(path) as fh:
            # as Spark's text source decodes: UTF-8, malformed bytes replaced
            text = bytes(fh.read()).decode("utf-8", errors="replace")
        yield pa.RecordBatch.from_pylist(
            [{"file": partition.value.rstrip("/").rsplit("/", 1)[-1], "value": text}],
            schema=pa.schema([("file", pa.string()), ("value", pa.string())]))


class ArrowTextSource(DataSource):  # type: ignore[misc]
    """``spark.read.format(TEXT_SOURCE_NAME).option("uris", json list)
    .option("storage.<key>", value)....load()``: one row per file, its name and its
    whole text (``TEXT_SCHEMA``)."""

    @classmethod
    def name(cls) -> str:
        return TEXT_SOURCE_NAME

    def schema(self) -> str:
        return TEXT_SCHEMA

    def reader(self, schema: Any) -> Any:
        return _TextReader(self.options)


class ArrowParquetSource(DataSource):  # type: ignore[misc]
    """``spark.read.format(SOURCE_NAME).schema(s).option("uris", json list)
    .option("storage.<key>", value)....load()``: the rows of those Parquet files."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:  # the reader always passes one
        raise ValueError(f"{SOURCE_NAME} needs a schema: .schema(...)")

    def reader(self, schema: Any) -> Any:
        return _FilesReader(schema, self.options)


def ship_by_value() -> None:
    """Make Spark's pickler send this module's code to the workers by value."""
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
