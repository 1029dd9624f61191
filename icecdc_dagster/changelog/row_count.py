"""Exact row counts of an Iceberg snapshot from its metadata (the summary, the manifests, small position
delete files), without a Spark job; None where only a scan knows (equality deletes)."""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyiceberg.manifest import DataFileContent, FileFormat, ManifestContent

from icecdc_dagster.changelog.plan import manifest_entries, referenced_data_file

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame

# Position delete files are read (never data files) only when several reference one data file or one
# references several; above this many bytes of them the count is left out rather than paid for.
MAX_DELETE_BYTES_READ = 64 << 20
_POS_FILE_PATH_FIELD_ID = 2147483546  # the spec's ``file_path`` column of a position delete file


def exact_row_count(table: "Table", snapshot_id: int | None = None) -> int | None:
    """Live rows of ``snapshot_id`` (default: the current snapshot), exact, or None; no Spark job.

    Without delete files the summary's ``total-records`` is exact. With delete files the summary's
    ``total-position-deletes`` still counts deletes of data files a compaction removed, so it is not
    subtracted: the manifests give the live data files and which of them each position delete file or
    deletion vector removes rows from (:func:`_live_rows`). Equality deletes: None (only a scan knows).

    Raises:
        OSError: pyiceberg's FileIO cannot read a manifest or a position delete file (passes through);
            nothing of its own (None: not countable from metadata).
    """
    snapshot = table.current_snapshot() if snapshot_id is None else table.snapshot_by_id(snapshot_id)
    if snapshot is None:
        return 0 if snapshot_id is None else None
    summary = snapshot.summary
    if summary is None or summary.get("total-records") is None:
        return None
    if int(summary.get("total-equality-deletes") or 0) > 0:
        return None
    if int(summary.get("total-delete-files") or 0) == 0:
        return int(summary.get("total-records") or 0)
    return _live_rows(table, snapshot)



def row_count(table: "Table", rows: "DataFrame", snapshot_id: int | None = None) -> int:
    """Rows of ``snapshot_id`` (default: current) of ``table``: :func:`exact_row_count` where the metadata
    knows, else ``rows`` (the same snapshot read by Spark) counted by a Spark job.

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: Spark's count of ``rows`` fails (passes
            through); nothing of its own.
    """
    exact = exact_row_count(table, snapshot_id)
    return exact if exact is not None else rows.count()

def _live_rows(table: "Table", snapshot: Any) -> int | None:
    """Records of the live data files minus the distinct deleted positions that fall in them."""
    version = int(table.metadata.format_version)
    records: dict[str, int] = {}
    deletes = []
    for manifest in snapshot.manifests(table.io):
        for entry in manifest_entries(table.io, manifest, version, discard_deleted=True):
            data_file = entry.data_file
            if data_file.content == DataFileContent.EQUALITY_DELETES:
                return None
            if manifest.content == ManifestContent.DATA:
                records[data_file.file_path] = int(data_file.record_count)
            else:
                deletes.append(data_file)
    by_target: dict[str, list[Any]] = {}
    unscoped = []  # position delete files that may name several data files: read, with all the others
    for delete in deletes:
        target = _referenced_file(delete, version)
        if target is None:
            unscoped.append(delete)
        elif target in records:  # else dangling: its data file was rewritten or removed
            by_target.setdefault(target, []).append(delete)
    # One delete file of a data file (a deletion vector is always alone, spec v3; a position file
    # lists a position once): its record count is what it removes. Several may overlap: read them.
    deleted = sum(int(files[0].record_count) for files in by_target.values() if len(files) == 1 and not unscoped)
    to_read = [*unscoped, *(f for files in by_target.values() if len(files) > 1 or unscoped for f in files)]
    if to_read:
        positions = _read_positions(table, to_read, set(records))
        if positions is None:
            return None
        deleted += positions
    return sum(records.values()) - deleted


def _referenced_file(delete: Any, format_version: int) -> str | None:
    """The one data file a delete file removes rows from, when the manifest says so."""
    referenced = referenced_data_file(delete, format_version)
    if referenced:
        return str(referenced)
    lower = (delete.lower_bounds or {}).get(_POS_FILE_PATH_FIELD_ID)
    upper = (delete.upper_bounds or {}).get(_POS_FILE_PATH_FIELD_ID)
    return lower.decode() if lower is not None and lower == upper else None


def _read_positions(table: "Table", files: Sequence[Any], live: set[str]) -> int | None:
    """Distinct (data file, position) pairs in live data files, read from position delete files (small:
    a path and a position per deleted row); None above :data:`MAX_DELETE_BYTES_READ` or for a format
    this reader does not know."""
    import pyarrow.parquet as pq  # ~70 ms more; only exact counts read delete files

    if sum(int(f.file_size_in_bytes) for f in files) > MAX_DELETE_BYTES_READ:
        return None
    seen: dict[str, set[int]] = {}
    for delete in files:
        if delete.file_format != FileFormat.PARQUET:
            return None
        with table.io.new_input(delete.file_path).open() as stream:
            rows = pq.read_table(stream, columns=["file_path", "pos"]).to_pydict()
        for path, pos in zip(rows["file_path"], rows["pos"], strict=True):
            if path in live:
                seen.setdefault(path, set()).add(int(pos))
    return sum(len(p) for p in seen.values())
