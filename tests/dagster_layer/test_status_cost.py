"""``icecdc status`` reads what can still be pending, never a line's history: with thousands of synced
partitions (seeded as ``bench/control_plane.py`` seeds them, no Spark) it asks the instance for a
handful of keys and records, and reports what reading every key reported."""

import uuid

import pyarrow as pa
import pytest
from dagster import AssetKey, AssetMaterialization, DagsterEvent, DagsterRunStatus, DynamicPartitionsDefinition
from dagster._core.events import AssetMaterializationPlannedData
from dagster._core.storage.dagster_run import DagsterRun

from bench.control_plane import seed
from icecdc_dagster.assets import naming
from icecdc_dagster.assets.maintenance import needed_snapshots
from icecdc_dagster.assets.naming import table_line
from icecdc_dagster.assets.source_table import build_source_asset
from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.lines import line as lines
from icecdc_dagster.sensors.ingest_sensor import ingest_line
from icecdc_dagster.status import ingest_status, table_status
from icecdc_dagster.steps.ordering import KeyStatus
from tests.helpers import write_pipeline

SYNCED = 5_000
READ_EVERY_KEY = {"get_dynamic_partitions", "get_status_by_partition", "get_materialized_partitions",
                  "get_latest_asset_partition_materialization_attempts_without_materializations"}
INSTANCE_READS = ("get_dynamic_partitions", "get_paginated_dynamic_partitions", "get_existing_dynamic_partitions",
                  "get_status_by_partition", "get_materialized_partitions", "fetch_materializations",
                  "fetch_planned_materializations", "get_runs", "get_run_records", "get_runs_count",
                  "get_asset_records")
STORAGE_READS = ("get_dynamic_partitions", "get_paginated_dynamic_partitions", "get_existing_dynamic_partitions",
                 "get_latest_storage_id_by_partition", "get_materialized_partitions",
                 "get_latest_asset_partition_materialization_attempts_without_materializations")


class Reads:
    """The real instance and event-log-storage calls, counted with the rows (keys, records) each returned."""

    def __init__(self, monkeypatch, instance):
        self.calls: list[tuple[str, int]] = []
        for owner, names in ((type(instance), INSTANCE_READS), (type(instance.event_log_storage), STORAGE_READS)):
            for name in names:
                monkeypatch.setattr(owner, name, self._counted(name, getattr(owner, name)))

    def _counted(self, name, real):
        def call(*args, **kwargs):
            result = real(*args, **kwargs)
            rows = getattr(result, "results", getattr(result, "records", result))
            self.calls.append((name, len(rows) if hasattr(rows, "__len__") else 1))
            return result

        return call

    @property
    def rows(self) -> int:
        return sum(rows for _, rows in self.calls)

    @property
    def names(self) -> set[str]:
        return {name for name, _ in self.calls}


def _table(catalog_settings, snapshots=5):
    catalog = catalog_settings.load_pyiceberg()
    catalog.create_namespace("db")
    table = catalog.create_table("db.orders", schema=pa.schema([pa.field("id", pa.int64(), nullable=False)]))
    for i in range(snapshots):
        table.append(pa.table({"id": pa.array([i], pa.int64())}, schema=pa.schema([pa.field("id", pa.int64(),
                                                                                             nullable=False)])))
    return [str(s.snapshot_id) for s in table.snapshots()]


def _pipeline(tmp_path, catalog_settings, opensearch_url, **extra):
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": "db.orders", "identifier_columns": ["id"],
         "sinks": [{"opensearch": {"hosts": [opensearch_url], "index": "orders"}}]}], **extra))
    return config, build_definitions(config)


def _attempt(instance, asset_key, key, status):
    """A run that planned ``key`` of the asset (as Dagster records at launch), left in ``status``."""
    run = instance.add_run(DagsterRun(job_name="__ASSET_JOB", run_id=str(uuid.uuid4()), status=status))
    instance.report_dagster_event(DagsterEvent.build_asset_materialization_planned_event(
        "__ASSET_JOB", "step", AssetMaterializationPlannedData(asset_key, partition=key)), run.run_id)


def test_status_of_a_long_table_line_reads_its_window_not_its_history(instance, catalog_settings, tmp_path,
                                                                      monkeypatch, opensearch_url):
    snapshots = _table(catalog_settings)
    config, defs = _pipeline(tmp_path, catalog_settings, opensearch_url)
    table = config.tables[0]
    line = table_line(table)
    new = seed(instance, line, SYNCED, snapshots)       # the last 2 synced keys are the table's first snapshots
    assert new == snapshots[2:]
    instance.add_dynamic_partitions(line.partitions_name, new[:1])                       # seen by the sensor
    _attempt(instance, naming.changelog_key(table), new[0], DagsterRunStatus.FAILURE)   # its batch failed
    reads = Reads(monkeypatch, instance)
    status = table_status(defs, instance, table)
    assert (status.known_partitions, status.unapplied_partitions, status.failed_partitions) == (SYNCED + 1, 3,
                                                                                                [new[0]])
    assert status.problem is None and status.line is None and status.superseded_partitions == 0
    (sink,) = status.sinks                               # a fresh index: no checkpoint, every key of the line
    assert (sink.checkpoint_snapshot_id, sink.pending_snapshots, sink.error) == (None, SYNCED + 3, None)
    assert not reads.names & READ_EVERY_KEY, reads.calls
    assert reads.rows < 50, reads.calls                  # of 10,000 materialisations and 5,000 keys


def test_status_of_a_resynced_line_counts_superseded_keys_without_reading_them(instance, catalog_settings, tmp_path,
                                                                             monkeypatch, opensearch_url):
    s1, s2, *new = _table(catalog_settings)
    config, defs = _pipeline(tmp_path, catalog_settings, opensearch_url)
    table = config.tables[0]
    line = table_line(table)
    seed(instance, line, SYNCED)                         # the old line, all applied
    bootstrap = f"{s1}@resync1"
    instance.add_dynamic_partitions(line.partitions_name, [bootstrap, s2])
    for key in (bootstrap, s2):
        for asset in line.asset_keys:   # every asset's batch records its line
            instance.report_runless_asset_event(AssetMaterialization(asset, partition=key,
                                                                     metadata={"line": bootstrap}))
    reads = Reads(monkeypatch, instance)
    status = table_status(defs, instance, table)
    assert (status.known_partitions, status.superseded_partitions, status.line) == (SYNCED + 2, SYNCED, bootstrap)
    assert (status.unapplied_partitions, status.failed_partitions, status.problem) == (3, [], None)
    assert [s.pending_snapshots for s in status.sinks] == [2 + 3]   # the active line and the new snapshots
    assert not reads.names & READ_EVERY_KEY, reads.calls
    assert reads.rows < 50, reads.calls


def test_maintenance_keeps_the_window_without_reading_the_history(instance, catalog_settings, tmp_path,
                                                                   monkeypatch, opensearch_url):
    """What maintenance must not expire (changelog batches and source snapshots a sink still needs),
    from the sensors' window: the sink lags one batch behind the changelog on a 5,000-key line."""
    snapshots = _table(catalog_settings)
    config, defs = _pipeline(tmp_path, catalog_settings, opensearch_url)
    table = config.tables[0]
    line = table_line(table)
    new = seed(instance, line, SYNCED, snapshots)
    instance.add_dynamic_partitions(line.partitions_name, new[:1])
    instance.report_runless_asset_event(AssetMaterialization(naming.changelog_key(table), partition=new[0]))
    source = catalog_settings.load_pyiceberg().load_table("db.orders")
    reads = Reads(monkeypatch, instance)
    pending, applied = needed_snapshots(instance, table, source)
    assert pending == [int(s) for s in snapshots[2:]]     # the sink's pending batch and the unseen snapshots
    assert applied == [int(snapshots[1])]                  # the newest batch both assets applied
    assert not reads.names & READ_EVERY_KEY, reads.calls
    assert reads.rows < 50, reads.calls


def test_observing_the_source_reports_the_newest_keys_not_the_history(instance, catalog_settings, tmp_path,
                                                                       opensearch_url):
    """The UI's "Observe" on the source asset of a 5,000-key line writes one page of observations (a
    key's data version is its snapshot id, which never changes), the newest keys with their ids."""
    from dagster import AssetRecordsFilter
    from dagster._core.definitions.observe import observe

    _table(catalog_settings, snapshots=1)
    config, _ = _pipeline(tmp_path, catalog_settings, opensearch_url)
    table = config.tables[0]
    line = table_line(table)
    seed(instance, line, SYNCED)
    newest = instance.get_paginated_dynamic_partitions(line.partitions_name, limit=1, ascending=False).results[0]
    assert observe([build_source_asset(table)], instance=instance).success
    records = instance.fetch_observations(AssetRecordsFilter(asset_key=naming.source_key(table)), limit=1000).records
    assert len(records) == lines.TAIL_PAGE
    versions = {r.partition_key: r.asset_observation.data_version for r in records}
    assert versions[newest] == newest


def test_ingest_status_walks_back_to_the_frontier(instance, catalog_settings, tmp_path, monkeypatch):
    landing = tmp_path / "landing"
    landing.mkdir()
    for name in ("p1.json", "p2.json", "p3.json"):
        (landing / name).write_text("{}\n")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [], ingest=[
        {"name": "orders_cdc", "landing": str(landing), "target": "db.orders", "identifier_columns": ["id"],
         "auto_create": True}]))
    entry = config.ingest[0]
    line = ingest_line(entry)
    seed(instance, line, SYNCED)                         # ingested files (no longer in the landing folder)
    instance.add_dynamic_partitions(line.partitions_name, ["p1.json", "p2.json"])   # known, not ingested
    _attempt(instance, naming.ingest_key(entry), "p1.json", DagsterRunStatus.FAILURE)
    reads = Reads(monkeypatch, instance)
    status = ingest_status(instance, entry)
    assert (status.files, status.not_ingested, status.failed) == (3, ["p1.json", "p2.json", "p3.json"], ["p1.json"])
    assert not reads.names & READ_EVERY_KEY, reads.calls
    # One page of keys newest first (the sensor's walk), each counted by the instance and its storage,
    # and that page's materialisations.
    assert reads.rows < 4 * lines.TAIL_PAGE, reads.calls


@pytest.mark.parametrize("later, expected", [
    (None, KeyStatus.DONE), (DagsterRunStatus.FAILURE, KeyStatus.DONE), (DagsterRunStatus.STARTED, KeyStatus.DONE)])
def test_pending_statuses_agree_with_dagsters_partition_status(instance, later, expected):
    """Each pending key's status from its own events equals Dagster's cached partition status
    (``key_statuses``); a key every asset materialised is DONE, as the sensors plan it, whatever
    was attempted on it since (Dagster's status would show that attempt)."""
    changelog, sink = AssetKey(["changelog", "db", "t_changelog"]), AssetKey(["replica", "db", "db_t"])
    line = lines.Line("db.t", DynamicPartitionsDefinition(name="snapshots__db_t"), (changelog, sink),
                      max_keys_per_run=10, max_retries=2)
    keys = ["done", "failed", "running", "half", "retried", "cancelled", "new"]
    instance.add_dynamic_partitions(line.partitions_name, keys)
    for asset in line.asset_keys:
        instance.report_runless_asset_event(AssetMaterialization(asset, partition="done"))
    _attempt(instance, changelog, "failed", DagsterRunStatus.FAILURE)
    _attempt(instance, sink, "running", DagsterRunStatus.STARTED)
    instance.report_runless_asset_event(AssetMaterialization(changelog, partition="half"))  # the sink lags
    _attempt(instance, sink, "retried", DagsterRunStatus.FAILURE)
    instance.report_runless_asset_event(AssetMaterialization(sink, partition="retried"))    # a retry succeeded
    _attempt(instance, changelog, "cancelled", DagsterRunStatus.CANCELED)
    expected_by_key = {"done": KeyStatus.DONE, "failed": KeyStatus.FAILED, "running": KeyStatus.IN_PROGRESS,
                       "half": KeyStatus.PENDING, "retried": KeyStatus.PENDING, "cancelled": KeyStatus.PENDING,
                       "new": KeyStatus.PENDING}
    assert lines.key_statuses(instance, line, keys) == expected_by_key
    if later is not None:                                # a re-execution of the done key
        _attempt(instance, sink, "done", later)
    assert lines.pending_statuses(instance, line, keys) == {**expected_by_key, "done": expected}
