"""What a snapshot changed, from table metadata only (manifests), without reading data files.

The plan decides how the rows are read: a snapshot that adds delete files, or that sits on a
table with live delete files, cannot go through Iceberg's changelog scan, and the plan says
which data files (or partitions) a time-travel diff has to look at.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyiceberg.avro.file import AvroFile
from pyiceberg.manifest import (
    MANIFEST_ENTRY_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    _inherit_from_manifest,
)

from icecdc_dagster.errors import SnapshotNotFoundError

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile, ManifestFile
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot
    from pyiceberg.typedef import Record

REPLACE = "replace"


@dataclass(frozen=True)
class DeleteFileInfo:
    """A delete file a snapshot added. ``referenced_data_file`` is set for file-scoped
    position deletes and v3 deletion vectors; equality deletes touch a whole partition."""

    path: str
    content: str  # "position", "equality" or "deletion_vector"
    spec_id: int
    partition: tuple[Any, ...]
    record_count: int
    referenced_data_file: str | None


@dataclass(frozen=True)
class ChangedFile:
    """A data file a snapshot added or removed, with what a reader outside Spark needs to read it right
    (format, partition) and to inherit v3 row lineage (first row id, data sequence number)."""

    path: str
    added: bool
    record_count: int
    size: int
    spec_id: int
    partition: tuple[Any, ...]
    file_format: str  # "PARQUET", "AVRO" or "ORC"
    first_row_id: int | None = None
    data_sequence_number: int | None = None


@dataclass(frozen=True)
class SnapshotPlan:
    table_name: str
    snapshot_id: int
    parent_id: int | None
    sequence_number: int
    operation: str
    committed_at_ms: int
    added_data_files: tuple[str, ...]
    removed_data_files: tuple[str, ...]
    added_delete_files: tuple[str, ...]
    affected_partitions: tuple[tuple[int, tuple[Any, ...]], ...]  # (spec_id, partition values)
    has_delete_files: bool  # this snapshot added or removed delete files
    live_delete_files: bool  # delete files are live in this snapshot (changelog scan refuses)
    delete_files: tuple[DeleteFileInfo, ...] = ()
    removed_delete_files: tuple[str, ...] = ()
    added_records: int = 0
    removed_records: int = 0
    data_file_records: tuple[tuple[str, int], ...] = ()  # every data file that is live in the parent or
    # this snapshot and whose rows may be read for this snapshot: (path, record count)
    format_version: int = 2

    @property
    def is_replace(self) -> bool:
        return self.operation == REPLACE

    @property
    def needs_diff(self) -> bool:
        """Iceberg's changelog scan throws while any delete file is live (or for v3 row lineage)."""
        return self.has_delete_files or self.live_delete_files or self.format_version >= 3

    @property
    def equality_partitions(self) -> tuple[tuple[int, tuple[Any, ...]], ...]:
        return tuple(sorted({(d.spec_id, d.partition) for d in self.delete_files
                             if d.referenced_data_file is None}, key=repr))

    @property
    def touched_data_files(self) -> tuple[str, ...]:
        """Data files of the parent whose rows this snapshot may have removed."""
        refs = {d.referenced_data_file for d in self.delete_files if d.referenced_data_file}
        return tuple(sorted(set(self.removed_data_files) | refs))


def manifest_entries(io: "FileIO", manifest: "ManifestFile", format_version: int,
                     discard_deleted: bool = False) -> list[Any]:
    """Entries of a manifest, read with the table's format version: pyiceberg 0.12's
    ``fetch_manifest_entry`` reads v2 fields only and loses v3's ``referenced_data_file`` (DVs)."""
    if format_version < 3:
        return manifest.fetch_manifest_entry(io, discard_deleted=discard_deleted)
    with AvroFile[ManifestEntry](
            io.new_input(manifest.manifest_path), MANIFEST_ENTRY_SCHEMAS[3],
            read_types={-1: ManifestEntry, 2: DataFile},
            read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent}) as reader:
        return [_inherit_from_manifest(entry, manifest) for entry in reader
                if not discard_deleted or entry.status != ManifestEntryStatus.DELETED]


_V3_FIELDS = [f.name for f in MANIFEST_ENTRY_SCHEMAS[3].find_field("data_file").field_type.fields]  # type: ignore[attr-defined]  # a StructType


def referenced_data_file(data_file: "DataFile", format_version: int) -> str | None:
    """v3 ``referenced_data_file`` (deletion vectors); pyiceberg's DataFile has no accessor for it."""
    if format_version < 3 or len(data_file) <= _V3_FIELDS.index("referenced_data_file"):
        return None
    return data_file[_V3_FIELDS.index("referenced_data_file")]


def table_name(table: "Table") -> str:
    return ".".join(table.name())


def snapshot_or_raise(table: "Table", snapshot_id: int) -> "Snapshot":
    snapshot = table.metadata.snapshot_by_id(int(snapshot_id))
    if snapshot is None:
        raise SnapshotNotFoundError(
            f"snapshot {snapshot_id} is not in the history of table {table_name(table)} "
            f"(expired, wrong table or never committed)")
    return snapshot


def parent_of(table: "Table", snapshot_id: int) -> int | None:
    """A snapshot's parent from the table metadata alone (no manifest is read, unlike :func:`plan_snapshot`).

    Raises:
        SnapshotNotFoundError: ``snapshot_id`` is not in the table's metadata.
    """
    return snapshot_or_raise(table, snapshot_id).parent_snapshot_id


def partition_key(partition: "Record | None") -> tuple[Any, ...]:
    if partition is None:
        return ()
    return tuple(partition[i] for i in range(len(partition)))


def _delete_content(data_file: "DataFile") -> str:
    if data_file.content == DataFileContent.EQUALITY_DELETES:
        return "equality"
    if str(data_file.file_format).upper().endswith("PUFFIN"):
        return "deletion_vector"
    return "position"


ChangedDataFile = tuple[str, int, int, tuple[Any, ...]]
"""(path, record count, spec id, partition values) of a data file a snapshot added or removed."""

DataFileChanges = Callable[[int], "tuple[list[ChangedDataFile], list[ChangedDataFile]] | None"]
"""Given a snapshot id, the (added, removed) data files of that snapshot, read by an engine that
decodes manifests faster than pyiceberg (Iceberg's JVM); None to decline."""

# A manifest the snapshot wrote that carries this many more unchanged entries than changed ones is
# decoded by ``data_file_changes`` when one is given: pyiceberg decodes about 30,000 entries a second,
# so one small change on a table of 20,000 files would otherwise cost the whole manifest.
_LARGE_MANIFEST_EXISTING = 1000


def _needs_fast_reader(manifests: list[Any], snapshot_id: int) -> bool:
    own = [m for m in manifests if m.added_snapshot_id == snapshot_id and m.content == ManifestContent.DATA]
    existing = sum(m.existing_files_count or 0 for m in own)
    changed = sum((m.added_files_count or 0) + (m.deleted_files_count or 0) for m in own)
    return existing > _LARGE_MANIFEST_EXISTING and existing > 4 * changed


def plan_snapshot(table: "Table", snapshot_id: int, data_file_changes: DataFileChanges | None = None) -> SnapshotPlan:
    """The snapshot's metadata-level change: files added/removed, delete files, partitions.

    ``data_file_changes``: read the added/removed data files with it instead of decoding the data
    manifests the snapshot wrote, when those are mostly unchanged entries (a small change on a table of
    many files rewrites a manifest of every file). Delete manifests are always decoded here.

    Raises:
        SnapshotNotFoundError: ``snapshot_id`` is not in the table's metadata.
        OSError: pyiceberg's FileIO cannot read a manifest list or manifest (passes through).
    """
    snapshot = snapshot_or_raise(table, snapshot_id)
    io = table.io
    added: list[str] = []
    removed: list[str] = []
    deletes: list[Any] = []
    removed_deletes: list[Any] = []
    partitions: set[tuple[int, tuple[Any, ...]]] = set()
    live_deletes = False
    added_records = removed_records = 0
    records: dict[str, int] = {}
    manifests = snapshot.manifests(io)
    fast = (data_file_changes(snapshot.snapshot_id)
            if data_file_changes is not None and _needs_fast_reader(manifests, snapshot.snapshot_id) else None)
    if fast is not None:
        for files, target in zip(fast, (added, removed), strict=True):
            for path, record_count, spec_id, values in files:
                target.append(path)
                records[path] = record_count
                partitions.add((spec_id, values))
        added_records = sum(records[p] for p in added)
        removed_records = sum(records[p] for p in removed)
    for manifest in manifests:
        is_delete_manifest = manifest.content == ManifestContent.DELETES
        if is_delete_manifest and ((manifest.added_files_count or 0) + (manifest.existing_files_count or 0)) > 0:
            live_deletes = True
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        if fast is not None and not is_delete_manifest:
            continue
        for entry in manifest_entries(io, manifest, int(table.metadata.format_version)):
            if entry.snapshot_id != snapshot.snapshot_id or entry.status == ManifestEntryStatus.EXISTING:
                continue
            data_file = entry.data_file
            key = (manifest.partition_spec_id, partition_key(data_file.partition))
            partitions.add(key)
            is_added = entry.status == ManifestEntryStatus.ADDED
            if data_file.content == DataFileContent.DATA:
                (added if is_added else removed).append(data_file.file_path)
                records[data_file.file_path] = data_file.record_count
                if is_added:
                    added_records += data_file.record_count
                else:
                    removed_records += data_file.record_count
            elif is_added:
                deletes.append(DeleteFileInfo(
                    path=data_file.file_path, content=_delete_content(data_file),
                    spec_id=manifest.partition_spec_id, partition=key[1], record_count=data_file.record_count,
                    referenced_data_file=referenced_data_file(data_file, int(table.metadata.format_version))))
            else:
                removed_deletes.append(data_file.file_path)
    summary = snapshot.summary
    operation = summary.operation.value if summary is not None else "append"
    return SnapshotPlan(
        table_name=table_name(table), snapshot_id=snapshot.snapshot_id, parent_id=snapshot.parent_snapshot_id,
        sequence_number=snapshot.sequence_number or 0, operation=operation,
        committed_at_ms=snapshot.timestamp_ms, added_data_files=tuple(added), removed_data_files=tuple(removed),
        added_delete_files=tuple(d.path for d in deletes),
        affected_partitions=tuple(sorted(partitions, key=repr)),
        has_delete_files=bool(deletes or removed_deletes), live_delete_files=live_deletes,
        delete_files=tuple(deletes), removed_delete_files=tuple(removed_deletes),
        added_records=added_records, removed_records=removed_records,
        data_file_records=tuple(sorted(records.items())),
        format_version=int(table.metadata.format_version))


def _ancestry(table: "Table") -> list[Any]:
    """The current snapshot's ancestry, oldest first."""
    chain, snapshot = [], table.metadata.current_snapshot()
    while snapshot is not None:
        chain.append(snapshot)
        snapshot = (table.metadata.snapshot_by_id(snapshot.parent_snapshot_id)
                    if snapshot.parent_snapshot_id is not None else None)
    return chain[::-1]


def ancestry_ids(table: "Table", after_snapshot_id: int | None, until_snapshot_id: int | None = None) -> list[int]:
    """Snapshot ids after ``after_snapshot_id`` (exclusive) up to ``until_snapshot_id`` (inclusive).

    Raises:
        SnapshotNotFoundError: a snapshot is not in the metadata, or ``after_snapshot_id`` is not an ancestor of
            ``until_snapshot_id`` (a rollback, an expiry).
    """
    ids = [s.snapshot_id for s in _ancestry(table)]
    name = table_name(table)
    if until_snapshot_id is not None:
        if int(until_snapshot_id) not in ids:
            snapshot_or_raise(table, until_snapshot_id)
            raise SnapshotNotFoundError(
                f"snapshot {until_snapshot_id} of table {name} is not an ancestor of its current snapshot")
        ids = ids[: ids.index(int(until_snapshot_id)) + 1]
    if after_snapshot_id is None:
        return ids
    if int(after_snapshot_id) not in ids:
        oldest = table.metadata.snapshot_by_id(ids[0]) if ids else None
        if oldest is not None and oldest.parent_snapshot_id == int(after_snapshot_id):
            return ids  # expired after the line passed it: the chain after it is intact
        snapshot_or_raise(table, after_snapshot_id)
        raise SnapshotNotFoundError(
            f"snapshot {after_snapshot_id} of table {name} is not an ancestor of snapshot "
            f"{until_snapshot_id if until_snapshot_id is not None else 'current'}")
    return ids[ids.index(int(after_snapshot_id)) + 1:]


def snapshots_after(table: "Table", after_snapshot_id: int | None,
                    until_snapshot_id: int | None = None) -> list[SnapshotPlan]:
    """Plans of the current ancestry after ``after_snapshot_id`` (exclusive), oldest first.

    Raises:
        SnapshotNotFoundError: as :func:`ancestry_ids` (a snapshot gone, or not an ancestor).
        OSError: pyiceberg's FileIO cannot read a manifest (passes through).
    """
    return [plan_snapshot(table, sid) for sid in ancestry_ids(table, after_snapshot_id, until_snapshot_id)]


def accepted_predecessors(table: "Table", snapshot_id: int) -> tuple[int, ...]:
    """The parent plus ancestors reachable from it through REPLACE (compaction) snapshots.

    Raises:
        SnapshotNotFoundError: ``snapshot_id`` is not in the table's metadata (expired, or another table's).
    """
    snapshot = snapshot_or_raise(table, snapshot_id)
    result: list[int] = []
    parent_id = snapshot.parent_snapshot_id
    while parent_id is not None:
        result.append(parent_id)
        parent = table.metadata.snapshot_by_id(parent_id)
        if parent is None or parent.summary is None or parent.summary.operation.value != REPLACE:
            break
        parent_id = parent.parent_snapshot_id
    return tuple(result)
