"""Planning a line from its frontier, against a real Dagster instance: only keys after the newest
key done in every asset are planned, whatever the history (no Spark needed)."""

import uuid

import pytest
from dagster import AssetKey, AssetMaterialization, DagsterRunStatus, DynamicPartitionsDefinition
from dagster._core.storage.dagster_run import DagsterRun

from icecdc_dagster import run_tags
from icecdc_dagster.lines import line as lines
from icecdc_dagster.lines.window import ancestry_window
from icecdc_dagster.sensors.ingest_sensor import unknown_keys
from icecdc_dagster.steps.ordering import Blocked, NextRun

CHANGELOG, SINK = AssetKey(["changelog", "db", "t_changelog"]), AssetKey(["replica", "db", "db_t_copy"])


def make_line(per_run: int = 10, retries: int = 2) -> lines.Line:
    return lines.Line("db.t", DynamicPartitionsDefinition(name="snapshots__db_t"), (CHANGELOG, SINK),
                      max_keys_per_run=per_run, max_retries=retries)


def materialize(instance, asset: AssetKey, *keys: str) -> None:
    for key in keys:
        instance.report_runless_asset_event(AssetMaterialization(asset, partition=key))


def failed_run(instance, line: lines.Line, first: str, last: str) -> None:
    instance.add_run(DagsterRun(job_name="__ASSET_JOB", run_id=str(uuid.uuid4()), status=DagsterRunStatus.FAILURE,
                                tags={run_tags.TABLE_TAG: line.line_id, run_tags.FIRST_SNAPSHOT_TAG: first,
                                      run_tags.LAST_SNAPSHOT_TAG: last}))


def test_pending_keys_start_after_the_newest_key_done_in_every_asset(instance):
    line = make_line()
    keys = [f"k{i:03d}" for i in range(12)]
    instance.add_dynamic_partitions(line.partitions_def.name, keys)
    materialize(instance, CHANGELOG, *keys[:9])   # the changelog is ahead of the sink
    materialize(instance, SINK, *keys[:7])
    assert lines.pending_keys(instance, line, page_size=2) == keys[7:]   # frontier found across pages
    assert lines.newest_key(instance, line) == "k011"
    assert lines.done_in_every_asset(instance, line, keys[5:9]) == {"k005", "k006"}


def test_new_keys_follow_the_pending_ones_and_nothing_pending_means_done(instance):
    line = make_line(per_run=3)
    instance.add_dynamic_partitions(line.partitions_def.name, ["a", "b"])
    materialize(instance, CHANGELOG, "a", "b")
    materialize(instance, SINK, "a", "b")
    assert lines.plan(instance, line) is None
    assert lines.plan(instance, line, ["c", "d", "e", "f"]) == NextRun("c", "e", ("c", "d", "e"), 1)


def test_a_fresh_line_plans_from_its_first_key(instance):
    line = make_line(per_run=2)
    instance.add_dynamic_partitions(line.partitions_def.name, ["x", "y", "z"])
    assert lines.pending_keys(instance, line, page_size=1) == ["x", "y", "z"]
    assert lines.plan(instance, line) == NextRun("x", "y", ("x", "y"), 1)


def test_failed_first_key_is_retried_alone_then_blocks_the_line(instance):
    line = make_line(per_run=5, retries=2)
    instance.add_dynamic_partitions(line.partitions_def.name, ["s1", "s2", "s3"])
    materialize(instance, CHANGELOG, "s1")
    materialize(instance, SINK, "s1")
    failed_run(instance, line, "s2", "s3")          # a catch-up range that failed
    failed_run(instance, make_line(), "s9", "s9")   # another key's failure does not count for s2
    assert lines.plan(instance, line) == NextRun("s2", "s2", ("s2",), 2)
    failed_run(instance, line, "s2", "s2")
    failed_run(instance, line, "s2", "s2")
    blocked = lines.plan(instance, line)
    assert isinstance(blocked, Blocked) and blocked.failed and blocked.key == "s2" and "failed 3 times" in blocked.reason


def test_a_run_in_progress_blocks_the_line(instance):
    line = make_line()
    instance.add_dynamic_partitions(line.partitions_def.name, ["s1"])
    instance.add_run(DagsterRun(job_name="__ASSET_JOB", run_id=str(uuid.uuid4()), status=DagsterRunStatus.STARTED,
                                tags={run_tags.TABLE_TAG: line.line_id, run_tags.FIRST_SNAPSHOT_TAG: "s1"}))
    blocked = lines.plan(instance, line)
    assert isinstance(blocked, Blocked) and blocked.key == "s1" and "in progress" in blocked.reason


def test_landing_files_unknown_to_the_instance_include_late_arrivals_under_older_names(instance):
    line = lines.Line("landing", DynamicPartitionsDefinition(name="landing__orders"), (AssetKey(["ingest", "o"]),),
                      max_keys_per_run=1, max_retries=0)
    instance.add_dynamic_partitions(line.partitions_def.name, ["f2.json", "f3.json"])
    assert unknown_keys(instance, line, ["f1.json", "f2.json", "f3.json", "f4.json"]) == ["f1.json", "f4.json"]
    assert unknown_keys(instance, line, []) == []


def test_a_table_line_plans_from_its_ancestry_after_the_laggard_assets_latest_key(instance, catalog_settings):
    """No Spark: a pyiceberg table with five appends; the window is its ancestry after the oldest
    latest materialisation, a manual re-execution of an old key only widens it."""
    import pyarrow as pa

    catalog = catalog_settings.load_pyiceberg()
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", schema=pa.schema([pa.field("id", pa.int64())]))
    for i in range(5):
        table.append(pa.table({"id": [i]}))
    s1, s2, s3, s4, s5 = (str(s.snapshot_id) for s in table.snapshots())
    line = make_line(per_run=10)
    instance.add_dynamic_partitions(line.partitions_def.name, [s1, s2, s3])
    assert ancestry_window(instance, line, table) is None            # nothing materialised yet
    materialize(instance, CHANGELOG, s1, s2, s3)
    materialize(instance, SINK, s1, s2)                               # the sink lags behind
    assert ancestry_window(instance, line, table) == [s3, s4, s5]
    assert lines.plan(instance, line, window=[s3, s4, s5]) == NextRun(s3, s5, (s3, s4, s5), 1)
    materialize(instance, SINK, s1)                                   # a manual re-execution of s1
    window = ancestry_window(instance, line, table)
    assert window == [s2, s3, s4, s5]
    assert lines.plan(instance, line, window=window) == NextRun(s3, s5, (s3, s4, s5), 1)   # s2 is done
    materialize(instance, SINK, s3)
    materialize(instance, CHANGELOG, s4, s5)
    materialize(instance, SINK, s4, s5)
    assert lines.plan(instance, line, window=ancestry_window(instance, line, table)) is None


@pytest.mark.parametrize("polling_s, minimum", [(5, 4), (30, 29), (1, 1), (0.5, 1), (2.5, 2)])
def test_sensor_minimum_interval_stays_under_the_polling_interval(polling_s, minimum):
    from icecdc_dagster.lines.line import minimum_interval

    assert minimum_interval(polling_s) == minimum


def test_a_join_run_requests_only_the_joining_sink_and_its_own_run_key():
    """The sensor's request for a sink joining at an applied key: that sink alone (no changelog, none of
    the changelog's batch checks), under a run key the key's earlier runs never used."""
    from dagster import AssetCheckKey

    line = lines.Line("db.t", DynamicPartitionsDefinition(name="snapshots__db_t"), (CHANGELOG, SINK),
                      max_keys_per_run=10, max_retries=2, check_keys=(AssetCheckKey(CHANGELOG, "stuck"),),
                      joinable=(SINK,))
    planned = NextRun("s3", "s3", ("s3",), 1, assets=(SINK.to_user_string(),))
    request = lines.run_request(line, planned)
    assert list(request.asset_selection) == [SINK] and list(request.asset_check_keys) == []
    assert request.run_key != NextRun("s3", "s3", ("s3",), 1).run_key and "join" in request.run_key
    whole = lines.run_request(line, NextRun("s3", "s3", ("s3",), 1))
    assert list(whole.asset_selection) == [CHANGELOG, SINK]
