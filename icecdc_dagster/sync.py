"""Apply every pending batch now, in order, through the Dagster definitions.

What the sensors and daemon do over time, done in one process with one warm
SparkSession: same ordering logic, same assets, every run and materialisation
recorded in the Dagster instance (``DAGSTER_HOME``), so the UI shows it all.
Ingest entries go first, so tables they write are synced onward in the same call.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from dagster import DagsterInstance, Definitions

from icecdc_dagster.config import IngestConfig, PipelineConfig, TableConfig
from icecdc_dagster.pipeline.ordering import Blocked, NextRun
from icecdc_dagster.sensors import ingest as ingest_sensor
from icecdc_dagster.sensors import line as lines
from icecdc_dagster.sensors import snapshots


@dataclass
class TableSyncReport:
    table_name: str  # a table name, or "ingest:<name>" for an ingest entry
    runs: list[tuple[str, str, bool]] = field(default_factory=list)  # (first, last, success)
    blocked: str | None = None

    @property
    def ok(self) -> bool:
        return self.blocked is None and all(success for *_, success in self.runs)


def _sync_line(defs: Definitions, instance: DagsterInstance, line: lines.Line,
               evaluate: Callable[[], tuple[list[str], NextRun | Blocked | None]], max_runs: int,
               retry_failed: bool = False) -> TableSyncReport:
    report = TableSyncReport(line.line_id)
    job = defs.resolve_implicit_global_asset_job_def()
    retried: set[str] = set()
    for _ in range(max_runs):
        new_keys, planned = evaluate()
        if new_keys:
            instance.add_dynamic_partitions(line.partitions_def.name, new_keys)
        if isinstance(planned, Blocked) and planned.failed and retry_failed and planned.key not in retried:
            # The operator's re-execution, once per sync: the line continues only if it succeeds.
            retried.add(planned.key)
            planned = NextRun(planned.key, planned.key, (planned.key,), attempt=0)
        if isinstance(planned, Blocked):
            report.blocked = planned.reason
            return report
        if planned is None:
            return report
        if report.runs and not report.runs[-1][2] and report.runs[-1][0] == planned.first_key:
            report.blocked = f"{planned.first_key} failed again; see the run's logs"
            return report
        request = lines.run_request(line, planned)
        result = job.execute_in_process(
            instance=instance, partition_key=request.partition_key, asset_selection=list(line.asset_keys),
            tags=request.tags, raise_on_error=False)
        report.runs.append((planned.first_key, planned.last_key, result.success))
    return report


def sync_table(defs: Definitions, instance: DagsterInstance, table: TableConfig, max_runs: int = 1000,
               retry_failed: bool = False) -> TableSyncReport:
    catalog = defs.resources["catalog"]

    def evaluate():  # noqa: ANN202
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return snapshots.evaluate(instance, table, catalog.load_table(table.table_name))
        except NoSuchTableError:  # written by an auto-creating ingest entry that has not run yet
            return [], None

    return _sync_line(defs, instance, snapshots.table_line(table), evaluate, max_runs, retry_failed)


def sync_ingest(defs: Definitions, instance: DagsterInstance, entry: IngestConfig,
                max_runs: int = 1000, retry_failed: bool = False) -> TableSyncReport:
    return _sync_line(defs, instance, ingest_sensor.ingest_line(entry),
                      lambda: ingest_sensor.evaluate(instance, entry), max_runs, retry_failed)


def sync_all(config: PipelineConfig, defs: Definitions, instance: DagsterInstance,
             retry_failed: bool = False) -> list[TableSyncReport]:
    """Every line is synced independently: one blocked line does not stop the others.
    ``retry_failed``: re-execute (once) a batch that used up its retries, as an operator would."""
    return ([sync_ingest(defs, instance, entry, retry_failed=retry_failed) for entry in config.ingest]
            + [sync_table(defs, instance, table, retry_failed=retry_failed) for table in config.tables])


__all__ = ["NextRun", "TableSyncReport", "sync_all", "sync_ingest", "sync_table"]
