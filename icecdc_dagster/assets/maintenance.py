"""``maintenance/<ns>/<table>_maintenance``: compaction, changelog expiry and the retention guard of a table group,
on a schedule (``maintenance_schedule``, default daily 03:00), visible in the group's graph.

The asset holds the line lock of the table (and of each ingest entry writing it) while it works, so it
never interleaves with a batch of the same line: a sync or run that starts meanwhile waits, and no
commit is lost. What a sink still needs (its checkpoint, pending snapshots) is never expired.
"""

import time
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSelection,
    DefaultScheduleStatus,
    MaterializeResult,
    ScheduleDefinition,
    asset,
)
from pyiceberg.exceptions import NoSuchTableError

from icecdc_dagster.assets import naming
from icecdc_dagster.config import IngestConfig, TableConfig
from icecdc_dagster.lease.executor import line_job
from icecdc_dagster.lease.holder import Holder
from icecdc_dagster.lease.line_lock import LineLock, holding
from icecdc_dagster.lines.batch_metadata import MaintenanceMetadata
from icecdc_dagster.lines.line import key_statuses
from icecdc_dagster.lines.window import TableWindow, line_view
from icecdc_dagster.resources import catalog_resource_keys, run_catalog
from icecdc_dagster.resources.keys import SPARK_KEY
from icecdc_dagster.steps import lifecycle
from icecdc_dagster.steps import table_maintenance as maintenance
from icecdc_dagster.steps.ordering import KeyStatus

if TYPE_CHECKING:
    from dagster import DagsterInstance
    from pyiceberg.table import Table


def maintenance_key(table: TableConfig) -> AssetKey:
    return naming.maintenance_key(table)


def build_maintenance_schedule(table: TableConfig) -> ScheduleDefinition:
    name = "maintenance__" + naming.group_name(table)
    return ScheduleDefinition(name=name, cron_schedule=table.maintenance_schedule,
                              target=line_job(name, AssetSelection.assets(maintenance_key(table))
                                              | AssetSelection.checks(*naming.consistency_check_keys(table))),
                              default_status=DefaultScheduleStatus.RUNNING,
                              description=f"Compaction and expiry for the {table.table_name} group, and each "
                                          f"sink's consistency check ({naming.CONSISTENCY_CHECK}).")


def build_maintenance_asset(table: TableConfig, writers: tuple[IngestConfig, ...] = ()) -> AssetsDefinition:
    # (catalog name or None for the default, table): each replica is maintained in its own catalog
    replicas = [(s.target_catalog, t) for s in table.sinks if (t := s.maintained_table())]
    named = [t if c is None else f"{c}.{t}" for c, t in replicas]

    @asset(
        key=maintenance_key(table),
        deps=[naming.changelog_key(table), *(naming.sink_key(s) for s in table.sinks)],
        group_name=naming.group_name(table),
        kinds={"iceberg", "spark"},
        required_resource_keys={SPARK_KEY, *catalog_resource_keys(*(c for c, _ in replicas))},
        description=(f"Compacts {', '.join(named + ([table.table_name] if writers else [])) or 'nothing'} when a "
                     f"partition has more than {table.compact_delete_files} delete files; expires "
                     f"{table.table_name}__changelog batches applied by every sink and older than "
                     f"{table.changelog_retention}; never expires a snapshot a sink still needs."),
    )
    def _maintain(context: AssetExecutionContext) -> MaterializeResult[Any]:
        catalog = run_catalog(context.resources, None)
        others = {c: run_catalog(context.resources, c) for c, _ in replicas if c is not None}
        spark = getattr(context.resources, SPARK_KEY).session(catalog, *others.values())
        holder = Holder.current(role="icecdc maintenance")
        lines = [table.table_name, *(naming.ingest_line_id(e) for e in writers)]
        results: list[maintenance.TableMaintenance] = []
        with ExitStack() as held:
            for line in sorted(lines):  # a fixed order: two holders of several locks never deadlock
                held.enter_context(holding(LineLock.for_instance(context.instance, line), holder, wait=True,
                                           on_wait=context.log.info))
            try:
                source = catalog.load_table(table.table_name)
            except NoSuchTableError:
                return MaterializeResult(metadata=dict(MaintenanceMetadata(
                    skipped=f"{table.table_name} does not exist yet", tables_maintained=0, tables_compacted=0,
                    rewritten_data_files=0, removed_delete_files=0, deleted_batches=0, expired_snapshots=0)))
            pending, applied = needed_snapshots(context.instance, table, source)
            now = time.time()
            cutoff = now - table.changelog_retention_s
            for replica_catalog, replica in replicas:
                where = others[replica_catalog].name if replica_catalog is not None else catalog.name
                done = maintenance.compact(spark, where, replica, table.compact_delete_files)
                if done.skipped is None:
                    done.expired_snapshots = maintenance.expire_snapshots(spark, where, replica, cutoff)
                if replica_catalog is not None:
                    done.table = f"{replica_catalog}.{done.table}"  # named with its catalog in the metadata
                results.append(done)
            if writers:  # an ingest target that is also our source: compact, expire only what no sink needs
                done = maintenance.compact(spark, catalog.name, table.table_name, table.compact_delete_files)
                needed = pending + applied
                guarded = maintenance.guarded_expiry_cutoff(source, needed, cutoff)
                done.expired_snapshots = maintenance.expire_snapshots(spark, catalog.name, table.table_name, guarded)
                done.notes.append(f"expired before {maintenance.utc_timestamp(guarded)} UTC (retention guard)")
                results.append(done)
            results.append(maintenance.expire_changelog(spark, catalog.name, table.table_name,
                                                        table.changelog_retention_s, set(pending), now_s=now))
        metadata: dict[str, Any] = dict(MaintenanceMetadata(
            tables_maintained=len(results), tables_compacted=sum(r.compacted for r in results),
            rewritten_data_files=sum(r.rewritten_data_files for r in results),
            removed_delete_files=sum(r.removed_delete_files for r in results),
            deleted_batches=sum(r.deleted_batches for r in results),
            expired_snapshots=sum(r.expired_snapshots for r in results)))
        for r in results:
            prefix = r.table
            metadata[f"{prefix}: max delete files per partition"] = r.max_delete_files_per_partition
            metadata[f"{prefix}: compacted"] = r.compacted
            metadata[f"{prefix}: rewritten data files"] = r.rewritten_data_files
            metadata[f"{prefix}: deleted batches"] = r.deleted_batches
            metadata[f"{prefix}: expired snapshots"] = r.expired_snapshots
            if r.skipped:
                metadata[f"{prefix}: skipped"] = r.skipped
            for note in r.notes:
                metadata[f"{prefix}: note"] = note
        context.log.info("; ".join(f"{r.table}: compacted={r.compacted}, deleted batches={r.deleted_batches}, "
                                   f"expired snapshots={r.expired_snapshots}" for r in results))
        return MaterializeResult(metadata=metadata)

    return _maintain


def needed_snapshots(instance: "DagsterInstance", table: TableConfig, source: "Table") -> tuple[list[int], list[int]]:
    """(the snapshots the line has not applied everywhere, the newest it has): what maintenance must keep.

    The sensors' window when the line follows the table (a few indexed queries, whatever the history,
    so the line locks are held briefly); the whole active line's statuses otherwise (a resync without
    a batch yet, a diverged line)."""
    table_line = naming.table_line(table)
    view = line_view(instance, table_line, source)
    if isinstance(view, TableWindow):
        return [int(k) for k in view.keys], [view.applied]
    active = view.active
    statuses = key_statuses(instance, table_line, active)
    pending = [lifecycle.snapshot_id_of(k) for k in active if statuses.get(k) is not KeyStatus.DONE]
    applied = [lifecycle.snapshot_id_of(k) for k in active if statuses.get(k) is KeyStatus.DONE]
    return pending, applied[-1:]
