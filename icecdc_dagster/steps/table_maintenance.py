"""Table maintenance for a table group, with Iceberg's own Spark procedures (no Dagster here).

- **Compaction** of merge-on-read tables we write (replicas, ingest targets): every batch adds delete
  files; when one partition holds more than ``delete_files_threshold`` (default 50) of them,
  ``rewrite_data_files`` applies the deletes (and drops the dangling ones). Equality deletes
  (``write_mode: equality_deletes``) count like position deletes, and a rewrite of a table that has
  them gives its files a new sequence number, and the equality deletes no data file can see any
  more are then removed (one more commit). Safe for our
  checkpoints: they live in table properties (``writer.exactly_once``), not only in summaries.
- **Expiry** of the changelog store ``<table>__changelog``: batches older than the retention
  that every sink has applied are deleted (whole partitions: metadata only), then its snapshots
  older than the retention are expired. Replicas' snapshots expire by the same retention.
- **Retention guard**: a source table's snapshots are never expired by us; a table that is both
  an ingest target and a source is expired only before the oldest snapshot a sink still needs.
  :func:`retention_warning` tells ``icecdc status`` when the table's OWN expiry settings
  (``history.expire.max-snapshot-age-ms``) would expire a snapshot a sink still needs.
"""

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import functions as F

from icecdc_dagster.runtime.equality_writer import equality_delta_writer
from icecdc_dagster.steps.changelog_store import BATCH_SNAPSHOT_ID, changelog_table_name
from icecdc_dagster.writer import java_table

DEFAULT_DELETE_FILES_THRESHOLD = 50
DEFAULT_RETENTION_S = 7 * 24 * 3600.0
MAX_SNAPSHOT_AGE_PROPERTY = "history.expire.max-snapshot-age-ms"
MIN_SNAPSHOTS_PROPERTY = "history.expire.min-snapshots-to-keep"
DEFAULT_MAX_SNAPSHOT_AGE_MS = 5 * 24 * 3600 * 1000  # Iceberg's default


@dataclass
class TableMaintenance:
    """What maintenance did to one table (materialisation metadata)."""

    table: str
    max_delete_files_per_partition: int = 0
    compacted: bool = False
    rewritten_data_files: int = 0
    removed_delete_files: int = 0
    deleted_batches: int = 0
    expired_snapshots: int = 0
    skipped: str | None = None
    notes: list[str] = field(default_factory=list)


def utc_timestamp(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _exists(spark: Any, fq: str) -> bool:
    return spark.catalog.tableExists(fq)


def max_delete_files_per_partition(spark: Any, fq: str) -> int:
    """The most live delete files any one partition has (an aggregate over the metadata table)."""
    files = spark.table(f"{fq}.delete_files")
    grouped = files.groupBy("spec_id", "partition") if "partition" in files.columns else files.groupBy("spec_id")
    row = grouped.count().agg({"count": "max"}).first()
    return int(row[0] or 0) if row else 0


def has_equality_deletes(spark: Any, fq: str) -> bool:
    """Whether the table's current snapshot has live equality deletes (its summary's total)."""
    snap = java_table(spark, fq).currentSnapshot()
    return snap is not None and int(snap.summary().get("total-equality-deletes") or 0) > 0


def drop_dangling_equality_deletes(spark: Any, fq: str) -> int:
    """Remove the equality-delete files a rewrite left that no live data file can see (Iceberg keeps the
    newest batch's, and pyiceberg refuses any table that lists one): one commit, their count."""
    return int(equality_delta_writer(spark).dropDanglingEqualityDeletes(spark._jsparkSession, fq))  # noqa: SLF001


def compact(spark: Any, catalog_name: str, table: str,
            threshold: int = DEFAULT_DELETE_FILES_THRESHOLD) -> TableMaintenance:
    """``rewrite_data_files`` when a partition holds more than ``threshold`` delete files."""
    fq = f"{catalog_name}.{table}"
    result = TableMaintenance(table)
    if not _exists(spark, fq):
        result.skipped = "does not exist yet"
        return result
    result.max_delete_files_per_partition = max_delete_files_per_partition(spark, fq)
    if result.max_delete_files_per_partition <= threshold:
        return result
    # With equality deletes (write_mode equality_deletes), the rewritten files take the rewrite's own
    # sequence number: the batch's equality deletes then sit below every live data file and that commit
    # drops them (with the starting one, the newest batch's deletes would stay live, and pyiceberg refuses
    # any table that lists one). A writer's deletes committed meanwhile fail the rewrite, never get lost.
    starting = "false" if has_equality_deletes(spark, fq) else "true"
    row = spark.sql(f"CALL {catalog_name}.system.rewrite_data_files(table => '{table}', options => map("
                    f"'delete-file-threshold', '1', 'min-input-files', '1', "
                    f"'use-starting-sequence-number', '{starting}', "
                    f"'remove-dangling-deletes', 'true'))").first()
    result.compacted = True
    result.rewritten_data_files = int(row["rewritten_data_files_count"]) if row else 0
    result.removed_delete_files = int(row["removed_delete_files_count"] or 0) if row and \
        "removed_delete_files_count" in row.asDict() else 0
    if starting == "false":
        result.removed_delete_files += drop_dangling_equality_deletes(spark, fq)
    return result


def expire_snapshots(spark: Any, catalog_name: str, table: str, older_than_s: float) -> int:
    """Expire snapshots committed before ``older_than_s`` (epoch seconds); the current one always stays."""
    row = spark.sql(f"CALL {catalog_name}.system.expire_snapshots(table => '{table}', "
                    f"older_than => TIMESTAMP '{utc_timestamp(older_than_s)}', retain_last => 1)").first()
    return int(row["deleted_manifest_lists_count"] or 0) if row else 0


def expire_changelog(spark: Any, catalog_name: str, source_table: str, retention_s: float,
                     keep_batches: set[int], now_s: float | None = None) -> TableMaintenance:
    """Delete changelog batches older than the retention that every sink has applied (``keep_batches``:
    batch snapshot ids some asset has not applied yet), then expire the store's old snapshots."""
    table = changelog_table_name(source_table)
    fq = f"{catalog_name}.{table}"
    result = TableMaintenance(table)
    if not _exists(spark, fq):
        result.skipped = "does not exist yet"
        return result
    cutoff = (now_s if now_s is not None else time.time()) - retention_s
    # One row per batch (an aggregate over the store, never its change rows).
    old = (spark.table(fq).groupBy(BATCH_SNAPSHOT_ID).agg(F.max("_commit_timestamp").alias("t"))
           .where(F.col("t") < F.lit(utc_timestamp(cutoff)).cast("timestamp")).select(BATCH_SNAPSHOT_ID).collect())
    drop = sorted(int(r[0]) for r in old if int(r[0]) not in keep_batches)
    if drop:
        ids = ", ".join(str(i) for i in drop)
        spark.sql(f"DELETE FROM {fq} WHERE {BATCH_SNAPSHOT_ID} IN ({ids})")  # whole partitions: metadata only
    result.deleted_batches = len(drop)
    result.expired_snapshots = expire_snapshots(spark, catalog_name, table, cutoff)
    return result


def guarded_expiry_cutoff(source: Any, needed_snapshot_ids: list[int], cutoff_s: float) -> float:
    """The expiry cutoff for a table that is also a CDC source: never at or after the commit time of the
    oldest snapshot a sink still needs (``needed_snapshot_ids``: sinks' checkpoints and pending snapshots)."""
    times = [s.timestamp_ms / 1000 for s in (source.metadata.snapshot_by_id(i) for i in needed_snapshot_ids) if s]
    return min([cutoff_s, *times])


def retention_warning(source: Any, table_name: str, oldest_needed_snapshot_id: int | None,
                      now_s: float | None = None) -> str | None:
    """Warn when the table's own expiry settings would expire a snapshot the slowest sink still needs
    before it catches up: the snapshot is past half of ``history.expire.max-snapshot-age-ms``."""
    if oldest_needed_snapshot_id is None:
        return None
    snapshot = source.metadata.snapshot_by_id(oldest_needed_snapshot_id)
    if snapshot is None:
        return None  # already gone: the line's diagnosis says so
    properties = source.properties
    max_age_ms = int(properties.get(MAX_SNAPSHOT_AGE_PROPERTY, DEFAULT_MAX_SNAPSHOT_AGE_MS))
    age_ms = (now_s if now_s is not None else time.time()) * 1000 - snapshot.timestamp_ms
    if age_ms < max_age_ms / 2:
        return None
    left_h = (max_age_ms - age_ms) / 3_600_000
    when = f"in {left_h:.1f} h" if left_h > 0 else f"{-left_h:.1f} h ago (at its next expire_snapshots)"
    return (f"{table_name}: snapshot {oldest_needed_snapshot_id}, which the slowest sink still needs, is "
            f"{age_ms / 3_600_000:.1f} h old; the table's {MAX_SNAPSHOT_AGE_PROPERTY}={max_age_ms} makes it "
            f"expirable {when}. Catch the sinks up (icecdc sync) or raise it: ALTER TABLE {table_name} SET "
            f"TBLPROPERTIES ('{MAX_SNAPSHOT_AGE_PROPERTY}'='{max_age_ms * 4}')")
