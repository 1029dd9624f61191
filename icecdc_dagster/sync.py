"""Apply every pending batch of every table now, in order, through the Dagster definitions.

What the sensor and daemon do over time, done in one process with one warm
SparkSession: same ordering logic, same assets, every run and materialisation
recorded in the Dagster instance (``DAGSTER_HOME``), so the UI shows it all.
"""

from dataclasses import dataclass, field

from dagster import DagsterInstance, Definitions

from icecdc_dagster.assets import naming
from icecdc_dagster.config import PipelineConfig, TableConfig
from icecdc_dagster.pipeline.ordering import Blocked, NextRun
from icecdc_dagster.sensors.snapshots import asset_keys, evaluate, run_request


@dataclass
class TableSyncReport:
    table_name: str
    runs: list[tuple[str, str, bool]] = field(default_factory=list)  # (first, last, success)
    blocked: str | None = None

    @property
    def ok(self) -> bool:
        return self.blocked is None and all(success for *_, success in self.runs)


def sync_table(defs: Definitions, instance: DagsterInstance, table: TableConfig, max_runs: int = 1000) -> TableSyncReport:
    report = TableSyncReport(table.table_name)
    catalog = defs.resources["catalog"]
    job = defs.resolve_implicit_global_asset_job_def()
    partitions = naming.partitions_def(table)
    for _ in range(max_runs):
        source = catalog.load_table(table.table_name)
        new_keys, planned = evaluate(instance, table, source)
        if new_keys:
            instance.add_dynamic_partitions(partitions.name, new_keys)
        if isinstance(planned, Blocked):
            report.blocked = planned.reason
            return report
        if planned is None:
            return report
        if report.runs and not report.runs[-1][2] and report.runs[-1][0] == planned.first_key:
            report.blocked = f"snapshot {planned.first_key} failed again; see the run's logs"
            return report
        request = run_request(table, planned)
        result = job.execute_in_process(
            instance=instance, partition_key=request.partition_key, asset_selection=asset_keys(table),
            tags=request.tags, raise_on_error=False)
        report.runs.append((planned.first_key, planned.last_key, result.success))
    return report


def sync_all(config: PipelineConfig, defs: Definitions, instance: DagsterInstance) -> list[TableSyncReport]:
    """Every table is synced independently: one blocked table does not stop the others."""
    return [sync_table(defs, instance, table) for table in config.tables]


__all__ = ["NextRun", "TableSyncReport", "sync_all", "sync_table"]
