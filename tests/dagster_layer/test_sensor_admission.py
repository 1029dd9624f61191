"""Room in the run queue: a snapshot sensor requests only what the lanes will start soon, defers the other
lines without planning them, plans the deferred ones first when room comes back, and their runs then take
every snapshot committed meanwhile. Real instance (a queue of one run at a time), real catalog."""

import json

import pyarrow as pa
import pytest
from dagster import DagsterRunStatus, build_sensor_context, instance_for_test
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG
from dagster._core.test_utils import create_run_for_test

from icecdc_dagster.assets import naming
from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.sensors.admission import queue_budget
from icecdc_dagster.sensors.snapshots import ALL_TABLES_SENSOR, due_tables
from tests.helpers import write_pipeline

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
TABLES = ("a", "b", "c")


def test_the_queue_budget_covers_two_sensor_intervals_of_the_lanes_work_and_two_runs_per_lane_at_least():
    assert queue_budget(3, 5.0, 2.5) == 12  # 3 lanes x ceil(10 s / 2.5 s)
    assert queue_budget(3, 30.0, 3.0) == 60
    assert queue_budget(2, 5.0, 60.0) == 4  # long runs: still two per lane
    assert queue_budget(1, 5.0, 0.0) == 100  # a run that took no time does not divide by zero


def test_due_tables_are_the_longest_waiting_first_and_skip_those_whose_interval_has_not_passed(tmp_path,
                                                                                                catalog_settings):
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": f"db.{t}", "identifier_columns": ["id"]} for t in TABLES]))
    marks = {"db.a": {"at": 90.0}, "db.b": {"at": 10.0}, "db.c": {"at": 99.0}}  # c ticked 1 s ago
    due = due_tables(config.tables, marks, {t.table_name: 5 for t in config.tables}, now=100.0)
    assert [t.table_name for t in due] == ["db.b", "db.a"]


@pytest.fixture
def queue_of_one():
    with instance_for_test(overrides={"run_queue": {"max_concurrent_runs": 1}}) as instance:
        yield instance


def _head(catalog, table: str) -> str:
    return str(catalog.load_table(f"db.{table}").current_snapshot().snapshot_id)


def test_a_full_run_queue_defers_lines_unplanned_and_plans_them_first_when_it_drains(tmp_path, catalog_settings,
                                                                                     catalog, queue_of_one):
    instance = queue_of_one
    for t in TABLES:
        table = catalog.create_table(f"db.{t}", SCHEMA)
        table.append(pa.Table.from_pylist([{"id": 1, "v": "x"}], SCHEMA))
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": f"db.{t}", "identifier_columns": ["id"], "polling_interval": "PT5S"} for t in TABLES],
        snapshot_sensors="one"))
    defs = build_definitions(config)
    sensor = defs.get_sensor_def(ALL_TABLES_SENSOR)

    def evaluate(cursor):  # noqa: ANN001, ANN202 - one tick as the daemon runs it; its runs wait in the queue
        result = sensor.evaluate_tick(build_sensor_context(instance=instance, instance_ref=instance.get_ref(),
                                                           cursor=cursor, definitions=defs))
        for request in result.dynamic_partitions_requests or []:
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        return result

    def all_due(result):  # noqa: ANN001, ANN202 - the next tick, past every table's interval
        marks = json.loads(result.cursor)
        for mark in marks.values():
            mark["at"] -= 10
        return json.dumps(marks)

    # A queue of one run at a time, no run ended yet: room for 2; a user's two runs waiting to leave it fill it.
    users = [create_run_for_test(instance, job_name="their_job", status=DagsterRunStatus.NOT_STARTED) for _ in range(2)]
    full = evaluate(None)
    assert not full.run_requests
    assert "waiting for room in the run queue: 2 runs queued, 2 at most" in full.skip_message
    marks = json.loads(full.cursor)
    assert all(marks[f"db.{t}"]["at"] == 0.0 for t in TABLES), "a deferred line keeps its last tick's time"
    b_partitions = naming.partitions_def(config.tables[1]).name
    assert instance.get_dynamic_partitions(b_partitions) == [], "b was deferred before planning"

    # One queued run ends: room for one, the first line in order.
    instance.report_run_canceled(users[0])
    one = evaluate(full.cursor)
    assert [r.tags["icecdc/table"] for r in one.run_requests] == ["db.a"]
    marks = json.loads(one.cursor)
    assert marks["db.a"]["at"] > 0 and marks["db.b"]["at"] == marks["db.c"]["at"] == 0.0

    # b commits again while it waits; the queue drains: b and c go before a (deferred again, unplanned), and
    # b's run takes both snapshots.
    catalog.load_table("db.b").append(pa.Table.from_pylist([{"id": 2, "v": "y"}], SCHEMA))
    instance.report_run_canceled(users[1])
    before = all_due(one)
    drained = evaluate(before)
    requested = {r.tags["icecdc/table"]: r for r in drained.run_requests}
    assert set(requested) == {"db.b", "db.c"}
    b = requested["db.b"]
    assert (b.partition_key or b.tags[ASSET_PARTITION_RANGE_END_TAG]) == _head(catalog, "b")
    assert json.loads(drained.cursor)["db.a"] == json.loads(before)["db.a"], "a deferred: its mark unchanged"
