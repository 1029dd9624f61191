"""Read the rows a snapshot removed and added, restricted to the files it touched.

Every snapshot goes through one path: the parent's rows of the touched data files are read as
DELETE and the snapshot's rows of the same files plus its added files as INSERT; carry-over
removal then cancels the rows that did not change. This works for copy-on-write rewrites and
for merge-on-read position deletes, equality deletes and deletion vectors alike (a delete only
removes rows from an existing file), which Iceberg 1.10's changelog scan refuses.

Only the touched files are read: we plan the scan in Iceberg (JVM), keep the tasks of those files,
and read them through Iceberg's staged scan (the mechanism of rewrite_data_files), which applies
the delete files of that snapshot and projects every file onto the table's CURRENT schema.
"""

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from py4j.protocol import Py4JError
from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFileContent, ManifestContent
from pyiceberg.types import PrimitiveType

from icecdc_dagster.changelog.plan import (
    ChangedDataFile,
    ChangedFile,
    DataFileChanges,
    SnapshotPlan,
    partition_key,
    snapshot_or_raise,
)
from icecdc_dagster.column_names import quote
from icecdc_dagster.runtime.java import JavaObject, gateway, jvm

if TYPE_CHECKING:
    from pyiceberg.manifest import ManifestFile, PartitionFieldSummary
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, SparkSession

FILE_PATH_FIELD_ID = 2147483546  # position delete files: the data file path column

# Scan-task sets staged while a ``staged_scans`` block is open (None: not tracked).
_STAGED: ContextVar[list[Any] | None] = ContextVar("icecdc_staged_scans", default=None)


@contextmanager
def staged_scans(spark: "SparkSession") -> Iterator[None]:
    """Release, at the end of the block, the scan-task sets ``read_files`` staged inside it.

    A staged set pins its task list and table in the driver JVM until removed; a long-lived
    process (warm launcher, ``icecdc sync``) would otherwise grow with every batch. Only use the
    DataFrames built inside the block before it ends.

    Raises:
        Nothing of its own; whatever the ``with`` block raises passes through (the counter is reset).
    """
    staged: list[Any] = []
    token = _STAGED.set(staged)
    try:
        yield
    finally:
        _STAGED.reset(token)
        manager = jvm(spark).org.apache.iceberg.spark.ScanTaskSetManager.get()
        cache = _table_cache(spark)
        for jtable, group_id in staged:
            manager.removeTasks(jtable, group_id)
            cache.remove(group_id)


def staged_scan_count(spark: "SparkSession") -> int:
    """Tables pinned by staged scans in this JVM (observability and tests).

    Raises:
        Nothing of its own: it reads a counter of this process.
    """
    return int(_table_cache(spark).size())


def spark_identifier(catalog_name: str, table: "Table") -> str:
    """``catalog.namespace.table`` with every part quoted (names may hold dots, spaces, backticks)."""
    return ".".join(quote(part) for part in (catalog_name, *table.name()))


def _java_table(spark: "SparkSession", identifier: str) -> JavaObject:
    return jvm(spark).org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, identifier)


def _partition_values(spark: "SparkSession", partition: JavaObject) -> tuple[Any, ...]:
    """A JVM partition tuple as Python values (informational: types py4j does not map become strings)."""
    any_class = jvm(spark).java.lang.Object._java_lang_class
    values = []
    for i in range(int(partition.size())):
        value = partition.get(i, any_class)
        values.append(value if value is None or isinstance(value, (bool, int, float, str, bytes)) else str(value))
    return tuple(values)


def _described(spark: "SparkSession", files: JavaObject) -> list[tuple[str, int, int, tuple[Any, ...]]]:
    return [(str(f.location()), int(f.recordCount()), int(f.specId()), _partition_values(spark, f.partition()))
            for f in files]


def java_table(spark: "SparkSession", catalog_name: str, table: "Table") -> JavaObject:
    """The table as Iceberg's JVM API sees it; pass it to several ``read_files`` of one batch so that
    the table is loaded once and each snapshot's manifests are decoded once (Iceberg caches them)."""
    return _java_table(spark, spark_identifier(catalog_name, table))


def java_data_file_changes(spark: "SparkSession", jtable: JavaObject) -> DataFileChanges:
    """Data files a snapshot added and removed, read by Iceberg in the JVM (for ``plan_snapshot``):
    only the manifests that snapshot wrote are read, at JVM speed; py4j calls follow the changed files."""

    def changes(snapshot_id: int) -> tuple[list[ChangedDataFile], list[ChangedDataFile]] | None:
        snapshot = jtable.snapshot(int(snapshot_id))
        if snapshot is None:
            return None
        io = jtable.io()
        return _described(spark, snapshot.addedDataFiles(io)), _described(spark, snapshot.removedDataFiles(io))

    return changes


def _optional_long(value: Any) -> int | None:
    return None if value is None else int(value)


def _detailed(spark: "SparkSession", files: JavaObject, added: bool) -> list[ChangedFile]:
    return [ChangedFile(path=str(f.location()), added=added, record_count=int(f.recordCount()),
                        size=int(f.fileSizeInBytes()), spec_id=int(f.specId()),
                        partition=_partition_values(spark, f.partition()), file_format=str(f.format()),
                        first_row_id=_optional_long(f.firstRowId()),
                        data_sequence_number=_optional_long(f.dataSequenceNumber()))
            for f in files]


def changed_files(spark: "SparkSession", jtable: JavaObject, snapshot_id: int) -> list[ChangedFile] | None:
    """The data files a snapshot removed and added, described by Iceberg in the JVM, which applies the
    spec's inheritance (v3 first row ids, data sequence numbers) when it reads the snapshot's manifests.
    None when the snapshot is not in the JVM's view of the table."""
    snapshot = jtable.snapshot(int(snapshot_id))
    if snapshot is None:
        return None
    io = jtable.io()
    return _detailed(spark, snapshot.removedDataFiles(io), False) + _detailed(spark, snapshot.addedDataFiles(io), True)


def _table_cache(spark: "SparkSession") -> JavaObject:
    gw = gateway(spark)
    j = jvm(spark)
    cls = j.org.apache.iceberg.spark.SparkTableCache._java_lang_class
    return cls.getMethod("get", gw.new_array(j.java.lang.Class, 0)).invoke(
        None, gw.new_array(j.java.lang.Object, 0))


def _location_in(spark: "SparkSession", paths: set[str]) -> JavaObject:
    """A JVM ``Predicate<FileScanTask>``: ``task.file().location()`` is in ``paths``.

    Planning stays in the JVM: a table of 20,000 files costs one py4j call here, not three per task
    (``java.beans.EventHandler`` builds the predicate from the path set's ``contains``).
    """
    j = jvm(spark)
    wanted = j.java.util.HashSet()
    for path in paths:
        wanted.add(path)
    predicate = j.java.lang.Class.forName("java.util.function.Predicate")
    return j.java.beans.EventHandler.create(predicate, wanted, "contains", "file.location")


def _touched_tasks(spark: "SparkSession", planned: JavaObject, paths: set[str] | None) -> JavaObject:
    """The planned file tasks of ``paths`` (None: all), filtered in the JVM. A JDK without the
    ``java.desktop`` module (no ``java.beans``, e.g. a jlinked runtime) filters here instead: one py4j
    call per task, same result."""
    j = jvm(spark)
    lists = j.org.apache.iceberg.relocated.com.google.common.collect.Lists
    if paths is None:
        return lists.newArrayList(planned)
    try:
        matching = j.org.apache.iceberg.io.CloseableIterable.filter(planned, _location_in(spark, paths))
        return lists.newArrayList(matching)
    except Py4JError:
        tasks = j.java.util.ArrayList()
        iterator = planned.iterator()
        while iterator.hasNext():
            task = iterator.next()
            if task.file().location() in paths:
                tasks.add(task)
        return tasks


def _changed_file_tasks(spark: "SparkSession", jtable: JavaObject, snapshot_id: int, paths: set[str],
                        changed_by: int) -> JavaObject | None:
    """File tasks for ``paths`` built from the data files snapshot ``changed_by`` added (read as of
    ``changed_by``) or removed (read as of its parent), without planning the whole snapshot.

    Only valid when no delete file is live on either side (the tasks carry no deletes): Iceberg reads
    just the manifests ``changed_by`` wrote, so the cost follows the change, not the table's file count.
    None when a path is not among those files (the caller plans instead).
    """
    j = jvm(spark)
    snapshot = jtable.snapshot(int(changed_by))
    if snapshot is None:
        return None
    io = jtable.io()
    files = snapshot.addedDataFiles(io) if int(snapshot_id) == int(changed_by) else snapshot.removedDataFiles(io)
    read_at = jtable.snapshot(int(snapshot_id))
    if read_at is None:
        return None
    schema_id = read_at.schemaId()
    schema = jtable.schemas().get(schema_id) if schema_id is not None else None
    schema_json = j.org.apache.iceberg.SchemaParser.toJson(schema if schema is not None else jtable.schema())
    residuals = j.org.apache.iceberg.expressions.ResidualEvaluator.unpartitioned(
        j.org.apache.iceberg.expressions.Expressions.alwaysTrue())
    no_deletes = gateway(spark).new_array(j.org.apache.iceberg.DeleteFile, 0)
    specs = jtable.specs()
    spec_json: dict[int, str] = {}
    tasks = j.java.util.ArrayList()
    found = set()
    for data_file in files:
        location = data_file.location()
        if location not in paths or location in found:
            continue
        found.add(location)
        spec_id = int(data_file.specId())
        if spec_id not in spec_json:
            spec_json[spec_id] = j.org.apache.iceberg.PartitionSpecParser.toJson(specs.get(spec_id))
        tasks.add(j.org.apache.iceberg.BaseFileScanTask(data_file, no_deletes, schema_json, spec_json[spec_id],
                                                        residuals))
    return tasks if found == paths else None


def read_files(spark: "SparkSession", catalog_name: str, table: "Table", snapshot_id: int,
               paths: set[str] | None, changed_by: int | None = None,
               jtable: JavaObject | None = None) -> "DataFrame":
    """Rows of ``paths`` (None: every file) as of ``snapshot_id`` (its deletes applied), current schema.

    ``changed_by``: a snapshot that added all of ``paths`` (``snapshot_id == changed_by``) or removed
    them (``snapshot_id`` is its parent), with no delete file live on either side: the tasks are built
    from that snapshot's own manifests instead of planning every file of ``snapshot_id``.
    ``jtable``: the table from :func:`java_table` (loaded here when None).
    """
    identifier = spark_identifier(catalog_name, table)
    if jtable is None:
        jtable = _java_table(spark, identifier)
    j = jvm(spark)
    tasks = j.java.util.ArrayList()
    if paths is None or paths:
        direct = (_changed_file_tasks(spark, jtable, snapshot_id, paths, changed_by)
                  if paths and changed_by is not None else None)
        if direct is not None:
            tasks = direct
        else:
            planned = jtable.newScan().useSnapshot(int(snapshot_id)).planFiles()
            tasks = _touched_tasks(spark, planned, paths)
    if tasks.isEmpty():
        # Nothing to read: an empty relation of the current schema (metadata columns stay selectable).
        return spark.table(identifier).where("false")
    group_id = f"icecdc-{uuid.uuid4()}"
    j.org.apache.iceberg.spark.ScanTaskSetManager.get().stageTasks(jtable, group_id, tasks)
    _table_cache(spark).add(group_id, jtable)
    tracked = _STAGED.get()
    if tracked is not None:
        tracked.append((jtable, group_id))
    return spark.read.format("iceberg").option("scan-task-set-id", group_id).load(group_id)


def _delete_file_targets(table: "Table", plan: SnapshotPlan) -> tuple[set[str], set[tuple[int, tuple[Any, ...]]]]:
    """Data files named by the snapshot's delete files, and partitions touched without a file name."""
    files: set[str] = set(plan.removed_data_files)
    partitions: set[tuple[int, tuple[Any, ...]]] = set()
    bounds = _position_delete_bounds(table, plan)
    for delete in plan.delete_files:
        if delete.referenced_data_file:
            files.add(delete.referenced_data_file)
        elif delete.content == "position" and bounds.get(delete.path):
            files.add(bounds[delete.path])
        else:
            partitions.add((delete.spec_id, delete.partition))
    return files, partitions


def _position_delete_bounds(table: "Table", plan: SnapshotPlan) -> dict[str, str]:
    """Position delete files whose file_path column has one value (file-scoped) -> that data file."""
    if not any(d.content == "position" and not d.referenced_data_file for d in plan.delete_files):
        return {}
    snapshot = snapshot_or_raise(table, plan.snapshot_id)
    result = {}
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DELETES or manifest.added_snapshot_id != plan.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            data_file = entry.data_file
            if data_file.content != DataFileContent.POSITION_DELETES:
                continue
            lower = (data_file.lower_bounds or {}).get(FILE_PATH_FIELD_ID)
            upper = (data_file.upper_bounds or {}).get(FILE_PATH_FIELD_ID)
            if lower is not None and lower == upper:
                result[data_file.file_path] = bytes(lower).decode("utf-8")
    return result


def _summary_may_hold(summary: "PartitionFieldSummary", field_type: "PrimitiveType", value: Any) -> bool:
    """Whether a manifest's partition field summary admits ``value`` (undecidable: yes)."""
    if value is None:
        return bool(summary.contains_null)
    if summary.lower_bound is None or summary.upper_bound is None:
        return True
    try:
        lower = from_bytes(field_type, summary.lower_bound)
        upper = from_bytes(field_type, summary.upper_bound)
        return bool(lower <= value <= upper)
    except Exception:  # noqa: BLE001 - a type we cannot compare: read the manifest
        return True


def _manifest_may_hold(table: "Table", manifest: "ManifestFile", partitions: set[tuple[int, tuple[Any, ...]]]) -> bool:
    """Partition summaries of the manifest list prune manifests without reading them."""
    wanted = [values for spec_id, values in partitions if spec_id == manifest.partition_spec_id]
    if not wanted:
        return False
    summaries = manifest.partitions or []
    spec = table.specs().get(manifest.partition_spec_id)
    if spec is None or not summaries:
        return True
    fields = spec.partition_type(table.schema()).fields
    types = [f.field_type for f in fields if isinstance(f.field_type, PrimitiveType)]
    if len(types) != len(summaries):
        return True
    return any(len(values) == len(types)
               and all(_summary_may_hold(summary, field_type, value)
                       for summary, field_type, value in zip(summaries, types, values, strict=False))
               for values in wanted)


def _parent_files_in_partitions(table: "Table", parent_id: int,
                                partitions: set[tuple[int, tuple[Any, ...]]]) -> set[str]:
    """Live data files of the parent in the given (spec id, partition) set: equality deletes can
    remove rows from any older file of their partition (an unpartitioned table is one partition).

    Only manifests whose partition summaries may hold one of the partitions are read, so the cost
    follows the partitions touched, not the table (an unpartitioned delete reads every manifest).
    """
    if not partitions:
        return set()
    snapshot = snapshot_or_raise(table, parent_id)
    result = set()
    global_delete = any(not values for _, values in partitions)  # unpartitioned delete: every file
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        if not global_delete and not _manifest_may_hold(table, manifest, partitions):
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            key = (manifest.partition_spec_id, partition_key(entry.data_file.partition))
            if key in partitions or global_delete:
                result.add(entry.data_file.file_path)
    return result


def touched_files(table: "Table", plan: SnapshotPlan) -> tuple[set[str], set[str]]:
    """(files of the parent whose rows may have been removed, files of the snapshot to read)."""
    if plan.is_replace or plan.parent_id is None:
        return set(), set(plan.added_data_files) if not plan.is_replace else set()
    before, partitions = _delete_file_targets(table, plan)
    before |= _parent_files_in_partitions(table, plan.parent_id, partitions)
    # Files removed by the snapshot are gone from it; the rest are read again to see what survived.
    after = (before - set(plan.removed_data_files)) | set(plan.added_data_files)
    return before, after
