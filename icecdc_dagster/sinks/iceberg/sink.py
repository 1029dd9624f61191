"""Iceberg replica sink: apply each changelog batch of a source table to a downstream Iceberg table.

The checkpoint is the target's own history: every commit carries the source snapshot
id, sequence number and batch id in its summary, so a rerun or duplicate run is a
no-op and an out-of-order batch is refused (:func:`batch.decide`). The same properties are
written, in the same metadata commit, to the table property ``icecdc.last-batch``, so the
checkpoint survives compaction + snapshot expiry of the replica (which remove old summaries).
The export of a resync line (``icecdc resync``) replaces the replica's content in one overwrite.

The replica has the source's schema, partitioning, properties and format version. It never
receives the source's v3 lineage columns as data: a v3 replica has its own row lineage.
Rows are matched by the identifier columns; a keyless v3 source is matched by its ``_row_id``,
kept in the replica as the required identifier column ``_source_row_id`` (the one column the
replica has beyond the source's). A keyless source without row lineage can only be appended to
(``append_only``; the load refuses it otherwise, and a batch that deletes fails).

Schema evolution follows the source by field id (``writer.field_ids``): before a batch is written the
replica takes the source schema of the batch's snapshot (renames, drops, widenings, additions and
order, nested fields included); the table property ``icecdc.source-field-ids`` records which replica
field follows which source field. A change it cannot follow (identifier columns changed, a type it
cannot widen to) stops the line with :class:`SchemaChangeError`; the resync export rebuilds the replica.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pyiceberg.exceptions import NoSuchTableError
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from icecdc_dagster.batch import (
    CHANGE_ORDINAL,
    CHANGE_TYPE,
    COMMIT_SEQUENCE_NUMBER,
    DELETE,
    INSERT,
    ROW_ID,
    UPDATE_AFTER,
    BatchInfo,
    Checkpoint,
    Decision,
    decide,
)
from icecdc_dagster.changelog.observed import observe_change_counts
from icecdc_dagster.column_names import column
from icecdc_dagster.errors import SchemaChangeError, SinkWriteError, resync_command
from icecdc_dagster.runtime.catalog import catalog_errors, settings_of
from icecdc_dagster.runtime.java import java_map
from icecdc_dagster.sinks.base import ApplyResult, ColumnRanges, Disagreement
from icecdc_dagster.sinks.iceberg.agreement import replica_disagreements
from icecdc_dagster.writer import (
    FIELD_MAP_PROPERTY,
    MANIFEST_MERGE_PROPERTY,
    MERGED_MANIFEST_COUNT,
    OP_COLUMN,
    OP_DELETE,
    OP_INSERT,
    OP_UPSERT,
    ORDER_COLUMN,
    TARGET_SNAPSHOT_KEY,
    Evolution,
    SourceSchemas,
    align_by_name,
    bounds_of_ranges,
    copy_table,
    drop_table,
    encode_mapping,
    follow_source_schema,
    infer_mapping,
    java_table,
    last_batch,
    last_batch_in,
    load_mapping,
    main_ancestors,
    schema_of,
    set_identifier_fields,
    table_exists,
    table_properties,
    write_batch,
)
from icecdc_dagster.writer.metadata_reads import main_snapshots, summary_of

SOURCE_SNAPSHOT_PROPERTY = "icecdc.source-snapshot-id"
SOURCE_SEQUENCE_PROPERTY = "icecdc.source-sequence-number"
SOURCE_TABLE_PROPERTY = "icecdc.source-table"
LINE_PROPERTY = "icecdc.line"  # the resync key of the line the batch belongs to (absent: the original line)
KEYED_COUNTS = ("inserted", "updated", "deleted", "delete_missing")  # what a keyed MERGE counts
SOURCE_ROW_ID = "_source_row_id"
SOURCE_ROW_ID_DOC = "_row_id of the source row (icecdc replica key of a keyless v3 table)"
# Spark hands the observed event counts over just after the write's query ends; past this the caller counts.
OBSERVED_WAIT_S = 5.0


def _table_name(table: Any) -> str:
    """``db.name`` of a pyiceberg Table or a plain name."""
    if isinstance(table, str):
        return table.split(".", 1)[1] if table.count(".") >= 2 else table
    ident = table.name() if callable(getattr(table, "name", None)) else table.identifier
    return ".".join(ident[-2:])


def _checkpoint(properties: dict[str, str]) -> Checkpoint:
    return Checkpoint(int(properties[SOURCE_SNAPSHOT_PROPERTY]), int(properties[SOURCE_SEQUENCE_PROPERTY]),
                      properties.get(LINE_PROPERTY))


def _checkpoint_from(last: dict[str, str] | None, exists: Callable[[int], bool], ancestors: Iterable[tuple[int, Any]],
                     as_dict: Callable[[Any], dict[str, str]]) -> Checkpoint | None:
    """The replica's checkpoint: ``last`` (the ``icecdc.last-batch`` property) unless ``main`` was rolled
    back past the snapshot it names; ``ancestors``: (snapshot id, summary map) of ``main``, newest first."""
    published, recorded = None, None
    if last is not None and SOURCE_SNAPSHOT_PROPERTY in last:
        published, recorded = int(last.get(TARGET_SNAPSHOT_KEY, "0")), _checkpoint(last)
        if not exists(published):  # expired by maintenance: the property is all there is
            return recorded
    # Back from the current snapshot to the first batch: the published one (the property holds its
    # checkpoint), or an older batch when main was rolled back past it. Only the snapshots since
    # the last batch are read, not the table's history.
    for snapshot_id, summary in ancestors:
        if published is not None and snapshot_id == published:
            return recorded
        if summary.get(SOURCE_SNAPSHOT_PROPERTY) is not None:
            return _checkpoint(as_dict(summary))
    return None


MERGE_ON_READ, COPY_ON_WRITE = "merge-on-read", "copy-on-write"
_WRITE_MODE_PROPERTIES = ("write.merge.mode", "write.update.mode", "write.delete.mode")


def replica_table_properties(write_mode: str, format_version: int) -> list[tuple[str, str]]:
    """The table properties a created replica gets for ``write_mode`` (its other properties are the source's).

    Why merge-on-read by default: a replica takes one small MERGE per batch. Copy-on-write rewrites every data
    file a batch touches and finds them first (a runtime-filter subquery and its broadcast, the source persisted
    for its two reads); merge-on-read writes the batch's rows and a delete
    file (v2) or deletion vector (v3), and the table group's maintenance compacts them
    (``compact_delete_files``). bench/batch_profile.py: JVM 1.36 -> 0.98 CPU-s per small batch. Format v1 has no
    delete files: a v1 replica stays copy-on-write. Manifests are merged from
    :data:`writer.MERGED_MANIFEST_COUNT` on (why: there)."""
    mode = COPY_ON_WRITE if format_version < 2 else write_mode
    return [*((key, mode) for key in _WRITE_MODE_PROPERTIES),
            (MANIFEST_MERGE_PROPERTY, str(MERGED_MANIFEST_COUNT))]


class IcebergReplicaSink:
    """Keeps ``target_table`` equal to the source table at the last applied snapshot."""

    def __init__(self, spark: Any, catalog_name: str, pyiceberg_catalog: Any, target_table: str, source_table: Any,
                 identifier_columns: Sequence[str] = (), name: str | None = None,
                 source_catalog: str | None = None, write_mode: str = MERGE_ON_READ) -> None:
        """``catalog_name`` / ``pyiceberg_catalog``: the replica's catalog; ``source_catalog``: the Spark
        name of the source's, when it is another (both attached to ``spark``). ``write_mode``: how the
        replica this sink creates takes its MERGEs (:func:`replica_table_properties`)."""
        self.spark = spark
        self.catalog_name = catalog_name
        self.source_catalog = source_catalog or catalog_name
        self.pyiceberg_catalog = pyiceberg_catalog
        self.target_table = _table_name(target_table)
        self.source_table = _table_name(source_table)
        self.identifier_columns = tuple(identifier_columns)
        self.name = name or f"replica/{self.target_table}"
        self.write_mode = write_mode

    @property
    def _target(self) -> str:
        return f"{self.catalog_name}.{self.target_table}"

    @property
    def _source(self) -> str:
        return f"{self.source_catalog}.{self.source_table}"

    def read_checkpoint(self) -> Checkpoint | None:
        """The newest ancestor summary that carries a checkpoint, else the ``icecdc.last-batch`` property
        (after maintenance expired those summaries). The property wins unless ``main`` was rolled back
        past the snapshot it names (then the summaries say where the replica really is).

        Raises:
            py4j.protocol.Py4JJavaError: the catalog cannot load the replica.
        """
        if self.spark is None:  # icecdc status: the table's metadata, no SparkSession
            return self._checkpoint_in_metadata()
        with self._catalog_errors():
            if not table_exists(self.spark, self.catalog_name, self.target_table):
                return None
            return self._checkpoint_of(java_table(self.spark, self._target))

    def _catalog_errors(self, attributed: bool = True) -> Any:
        """The replica catalog's failures named as such (``runtime.catalog.catalog_errors``): certain where
        only the replica is touched (``attributed``), else only when the error names its address."""
        return catalog_errors(settings_of(self.pyiceberg_catalog, self.catalog_name), attributed)

    def _checkpoint_of(self, jtable: Any) -> Checkpoint | None:
        return _checkpoint_from(last_batch(jtable), lambda i: jtable.snapshot(i) is not None,
                                ((int(s.snapshotId()), s.summary()) for s in main_ancestors(jtable)), java_map)

    def _checkpoint_in_metadata(self) -> Checkpoint | None:
        """:meth:`read_checkpoint` from the replica's metadata by pyiceberg (no Spark)."""
        try:
            table = self.pyiceberg_catalog.load_table(self.target_table)
        except NoSuchTableError:
            return None
        return _checkpoint_from(last_batch_in(table.properties), lambda i: table.snapshot_by_id(i) is not None,
                                ((s.snapshot_id, summary_of(s)) for s in main_snapshots(table)), dict)

    def _keys(self) -> tuple[str, ...]:
        if self.identifier_columns:
            return self.identifier_columns
        return tuple(sorted(java_table(self.spark, self._target).schema().identifierFieldNames()))

    def keyed_by_row_id(self) -> bool:
        """No identifier columns, and the source has v3 row lineage: rows are matched by ``_row_id``."""
        if self.identifier_columns:
            return False
        source = java_table(self.spark, self._source)
        return int(source.operations().current().formatVersion()) >= 3

    def apply(self, batch: BatchInfo, events: DataFrame, ranges: ColumnRanges | None = None) -> ApplyResult:
        """MERGE the batch into the replica in one commit that records the checkpoint (created or evolved first).
        ``ranges``: the events' key range, read without a job (else one aggregate finds it).

        Raises:
            CheckpointError: the batch does not follow the replica's checkpoint (:func:`batch.decide`).
            SchemaChangeError: the replica cannot follow the source's schema in place (re-keyed, a type it
                cannot widen to); a resync batch rebuilds it instead.
            SinkWriteError: a delete with no identifier columns to match it, or a keyless v3 source whose
                replica is not keyed by ``_source_row_id``.
            StagingBranchLostError: the replica's staging branch vanished mid-write (``write_batch``);
                nothing was published.
            CatalogUnavailableError: the replica's catalog did not answer (transient); nothing was published.
            AccessRefusedError: the replica's catalog refused the credentials (terminal).
            pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: Spark or Iceberg refused the
                write; nothing was published.
        """
        with self._catalog_errors():  # the first call of the batch to the replica's catalog
            exists = table_exists(self.spark, self.catalog_name, self.target_table)
            # One load of the target serves the checkpoint and the identifier check.
            jtarget = java_table(self.spark, self._target) if exists else None
            checkpoint = self._checkpoint_of(jtarget) if jtarget is not None else None
        if decide(self.name, checkpoint, batch) is Decision.ALREADY_APPLIED:
            return ApplyResult(self.name, True, checkpoint)
        with self._catalog_errors(attributed=False):
            return self._write(batch, events, jtarget, ranges)

    def _write(self, batch: BatchInfo, events: DataFrame, jtarget: Any, ranges: ColumnRanges | None) -> ApplyResult:
        by_row_id = self.keyed_by_row_id()
        if by_row_id:
            events = self._with_source_row_id(batch, events)
        evolution = self._follow_source(batch, jtarget, by_row_id)
        keys = self._keys()
        if keys and not set(keys) <= set(events.columns):  # a batch read before a key column was renamed
            keys = tuple(sorted(java_table(self.spark, self._target).schema().identifierFieldNames()))
        if by_row_id and keys != (SOURCE_ROW_ID,):
            raise SinkWriteError(f"{self.name}: {self.target_table} replicates the keyless v3 table {batch.table_name} "
                                 f"but its identifier fields are {list(keys)}, not {SOURCE_ROW_ID}; it was not "
                                 f"created by this sink: drop it (or give it {SOURCE_ROW_ID}) and re-export")
        if not keys and events.where(F.col(CHANGE_TYPE) == DELETE).limit(1).count():
            raise SinkWriteError(f"{self.name}: snapshot {batch.snapshot_id} of {batch.table_name} deletes rows but "
                                 f"neither the sink nor {self.target_table} has identifier columns to match them")
        # Every event is read by the write (or none: a batch the ledger has): counted on the way.
        events, observed = observe_change_counts(events)
        op = (F.when(F.col(CHANGE_TYPE) == DELETE, F.lit(OP_DELETE))
              .when(F.col(CHANGE_TYPE) == INSERT, F.lit(OP_INSERT)).otherwise(F.lit(OP_UPSERT)))
        order = F.col(COMMIT_SEQUENCE_NUMBER) * F.lit(1 << 31) + F.col(CHANGE_ORDINAL)
        # Only the target's own columns: never the source's lineage, change or event columns.
        target_schema = self.spark.table(self._target).schema
        target_columns = [c for c in target_schema.names if c in events.columns]
        rows = (events.where(F.col(CHANGE_TYPE).isin(INSERT, DELETE, UPDATE_AFTER))
                .select(*[column(c) for c in target_columns], op.alias(OP_COLUMN), order.alias(ORDER_COLUMN)))
        # A replica is exact: an INSERT of a key the target already holds is still an upsert.
        rows = rows.withColumn(OP_COLUMN, F.when(F.col(OP_COLUMN) == OP_INSERT, F.lit(OP_UPSERT))
                               .otherwise(F.col(OP_COLUMN))) if keys else rows
        properties = {SOURCE_SNAPSHOT_PROPERTY: str(batch.snapshot_id),
                      SOURCE_SEQUENCE_PROPERTY: str(batch.sequence_number), SOURCE_TABLE_PROPERTY: batch.table_name}
        batch_id = f"{batch.table_name}@{batch.snapshot_id}"
        if batch.line is not None:
            properties[LINE_PROPERTY] = batch.line
            batch_id += f"/{batch.line}"
        # The key range from the stored batch's file statistics where they tell it (no aggregate over the rows).
        known = None if by_row_id or ranges is None or batch.resyncs_target or not keys else ranges(keys)
        bounds = None if known is None else bounds_of_ranges(known, keys, target_schema)
        # A resync export is the table's whole content: an overwrite drops rows the source no longer has.
        # Each key once already: to_events keeps one event per document id (an export's keys were checked), and a
        # document id is the line's key, the replica's too (a replica is never re-keyed: _evolve refuses).
        outcome = write_batch(self.spark, self._target, rows, keys, batch_id, properties,
                              replace_all=batch.resyncs_target, bounds=bounds, unique_keys=True)
        # Counted: every count shown, 0 included (the writer leaves zeros out; a plot of them would have gaps).
        counts = ({**dict.fromkeys(KEYED_COUNTS, 0), **outcome.counts}
                  if outcome.counted_by and "appended" not in outcome.counts else outcome.counts)
        return ApplyResult(self.name, outcome.skipped, batch.checkpoint, counts,
                           {"target_snapshot_id": outcome.snapshot_id, "added_columns": evolution.added,
                            "schema_changes": evolution.changes,
                            "counted_by": outcome.counted_by},
                           event_counts=None if outcome.skipped else observed.get(OBSERVED_WAIT_S))

    def disagreements(self, batch: BatchInfo, event_counts: Mapping[str, int],
                      result: ApplyResult) -> list[Disagreement]:
        """The MERGE's exact counts against the batch's events (:mod:`.agreement`: which batches compare)."""
        return replica_disagreements(batch, event_counts, result)

    def _follow_source(self, batch: BatchInfo, jtarget: Any, by_row_id: bool) -> Evolution:
        """Create the replica, or make it follow the source schema of the batch's snapshot by field id.
        A resync export rebuilds a replica that cannot follow."""
        source = SourceSchemas(self.spark, java_table(self.spark, self._source))
        schema = source.of(batch.schema_id)
        if jtarget is not None:
            try:
                return self._evolve(batch, jtarget, schema, source, by_row_id)
            except SchemaChangeError:
                if not batch.resyncs_target:
                    raise
            drop_table(self.spark, self.catalog_name, self.target_table)
        names = {f.field_id: f.name for f in schema.fields}
        current = {f.name: f.field_id for f in source.current.fields}
        keys = tuple(names.get(current.get(c, -1), c) for c in self.identifier_columns)
        copy_table(self.spark, self.source_catalog, self.source_table, self.target_table, keys,
                   target_catalog=self.catalog_name,
                   key_column=(SOURCE_ROW_ID, SOURCE_ROW_ID_DOC) if by_row_id else None, schema_id=schema.schema_id)
        created = java_table(self.spark, self._target)
        mapping = align_by_name(schema_of(self.spark, created.schema()), schema)
        update = created.updateProperties().set(FIELD_MAP_PROPERTY, encode_mapping(mapping))
        own = table_properties(created)
        for key, value in replica_table_properties(self.write_mode, created.operations().current().formatVersion()):
            if key != MANIFEST_MERGE_PROPERTY or key not in own:  # the source's own manifest setting stays
                update = update.set(key, value)
        update.commit()
        return Evolution(mapping, ["created"] if jtarget is None else ["rebuilt by the resync export"])

    def _describe(self, batch: BatchInfo) -> Any:
        def describe(cause: str) -> str:
            return (f"{self.name}: replica {self.target_table} cannot follow {batch.table_name} at snapshot "
                    f"{batch.snapshot_id}: {cause}; recover with {resync_command(batch.table_name)}")
        return describe

    def _evolve(self, batch: BatchInfo, jtarget: Any, schema: Any, source: SourceSchemas,
                by_row_id: bool) -> Evolution:
        describe = self._describe(batch)
        target = schema_of(self.spark, jtarget.schema())
        recorded = load_mapping(jtarget)
        mapping = recorded
        if mapping is None:  # a replica of an earlier version: matched by name once, then recorded
            inferred = infer_mapping(target, [schema, *source.history])
            if inferred.conflicts:
                stale, kept, sid = inferred.conflicts[0]
                raise SchemaChangeError(describe(
                    f"its columns {stale} and {kept} both stand for source field {sid} (a rename an earlier version "
                    f"followed by name: {stale} holds stale values)"))
            mapping = inferred.mapping
        self._check_identifier(jtarget, schema, source.current, mapping, by_row_id, describe)
        return follow_source_schema(self.spark, jtarget, schema, mapping, recorded, drop=True, describe=describe)

    def _check_identifier(self, jtarget: Any, schema: Any, current_schema: Any, mapping: dict[int, int],
                          by_row_id: bool, describe: Any) -> None:
        """The replica is keyed by the source's identifier columns (by id); other keys cannot be re-keyed in
        place. A replica without identifier fields gets them (as earlier versions did)."""
        if by_row_id or not self.identifier_columns:
            return
        current = {f.name: f.field_id for f in current_schema.fields}
        wanted = {current[c] for c in self.identifier_columns if c in current}
        have = {int(i) for i in jtarget.schema().identifierFieldIds()}
        if not have:
            names = {f.field_id: f.name for f in schema.fields}
            set_identifier_fields(self.spark, self._target, [names[i] for i in wanted if i in names])
            jtarget.refresh()
            return
        held = {mapping.get(i) for i in have}
        if held != wanted:
            old = sorted(str(jtarget.schema().findColumnName(i)) for i in have)
            raise SchemaChangeError(describe(f"its identifier columns changed from {old} to "
                                             f"{sorted(self.identifier_columns)}; a replica cannot be re-keyed "
                                             f"in place"))

    def _with_source_row_id(self, batch: BatchInfo, events: DataFrame) -> DataFrame:
        if ROW_ID not in events.columns:
            raise SinkWriteError(f"{self.name}: the events of snapshot {batch.snapshot_id} of the keyless v3 table "
                                 f"{batch.table_name} have no {ROW_ID} column to match replica rows by")
        if SOURCE_ROW_ID in events.columns:
            raise SinkWriteError(f"{self.name}: {batch.table_name} has a column named {SOURCE_ROW_ID}, the name its "
                                 f"replica {self.target_table} uses for the source's {ROW_ID}; declare "
                                 f"identifier_columns for {batch.table_name}")
        return events.withColumn(SOURCE_ROW_ID, F.col(ROW_ID))
