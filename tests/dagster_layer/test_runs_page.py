"""The runs page (issue 31, item 10), read through Dagster's GraphQL API as the UI reads it: a run of
a line names its target (the line's assets, which the Target column shows) and its user tags are the
line and its snapshots, not the worker's bookkeeping - for a sensor's run executed by a run worker
process (as Dagster's default launcher starts it) and for an ``icecdc sync`` run. The bookkeeping is
still on the runs, hidden, for crash recovery."""

import os
import time

from dagster import DagsterRunStatus

from icecdc_dagster.assets import naming
from icecdc_dagster.assets.naming import asset_keys
from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.lease.holder import Holder, heartbeat_of
from icecdc_dagster.run_tags import FIRST_SNAPSHOT_TAG, LAST_SNAPSHOT_TAG, LAUNCHED_BY_TAG, TABLE_TAG
from icecdc_dagster.sync import CODE_LOCATION, sync_table
from tests.dagster_layer.harness import create_launchable_run, start_run_worker, tick
from tests.helpers import write_pipeline

RUNS = """
query Runs($changelog: [String!]!) {
  runsOrError {
    ... on Runs {
      results { runId status jobName assetSelection { path } assetCheckSelection { name } tags { key value } }
    }
  }
  assetNodeOrError(assetKey: {path: $changelog}) {
    ... on AssetNode {
      assetChecksOrError {
        ... on AssetChecks {
          checks {
            name description
            executionForLatestMaterialization {
              runId status
              evaluation { metadataEntries { label ... on IntMetadataEntry { intValue } } }
            }
          }
        }
      }
    }
  }
}
"""

# Overview -> Timeline, as the UI asks (dagster-webserver's useRunsForTimeline: CompletedRunTimelineQuery with
# RunTimelineFragment); the UI draws a run only with a start time and a repository origin.
TIMELINE = """
query CompletedRunTimelineQuery($completedFilter: RunsFilter!, $limit: Int!, $cursor: String) {
  completed: runsOrError(filter: $completedFilter, limit: $limit, cursor: $cursor) {
    ... on Runs {
      results {
        id pipelineName externalJobSource tags { key value }
        repositoryOrigin { id repositoryName repositoryLocationName }
        status creationTime startTime endTime updateTime
      }
    }
  }
}
"""
DONE = ["SUCCESS", "FAILURE", "CANCELED"]


def test_runs_name_their_target_and_show_the_line_not_the_bookkeeping(spark, catalog_settings, catalog, instance,
                                                                      tmp_path, monkeypatch):
    from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql

    fq = f"{catalog_settings.name}.db.items"
    spark.sql(f"CREATE TABLE {fq} (id BIGINT NOT NULL, v STRING) USING iceberg TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {fq} SELECT id, concat('v', id) FROM range(0, 10)")
    path = write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": "db.items", "identifier_columns": ["id"],
         "sinks": [{"iceberg": {"table_name": "db.items_copy"}}]}])
    config = load_config(path)
    defs, table = build_definitions(config), config.tables[0]

    (request,) = tick(defs, instance, table, run=False).run_requests      # the sensor's run, in a run worker
    sensor_run = create_launchable_run(defs, instance, request, naming.sensor_name(table))
    worker = start_run_worker(instance, sensor_run, {**os.environ, "ICECDC_CONFIG": str(path)}, tmp_path / "w.log")
    assert worker.wait() == 0, (tmp_path / "w.log").read_text()[-3000:]
    spark.sql(f"INSERT INTO {fq} VALUES (99, 'v99')")
    assert sync_table(defs, instance, table).ok                              # an icecdc sync run

    code = tmp_path / "code.py"
    code.write_text("from icecdc_dagster.definitions import defs  # noqa: F401\n")
    monkeypatch.setenv("ICECDC_CONFIG", str(path))
    window = {"updatedAfter": time.time() - 3600, "updatedBefore": time.time() + 60, "statuses": DONE}
    with define_out_of_process_context(str(code), "defs", instance) as context:
        result = execute_dagster_graphql(context, RUNS, {"changelog": list(naming.changelog_key(table).path)})
        timeline = execute_dagster_graphql(context, TIMELINE, {"completedFilter": window, "limit": 500})
    assert not result.errors, result.errors
    assert not timeline.errors, timeline.errors
    runs = {r["runId"]: r for r in result.data["runsOrError"]["results"]}
    line_runs = [r for r in runs.values() if {"key": TABLE_TAG, "value": "db.items"} in r["tags"]]
    assert sensor_run.run_id in runs and len(line_runs) == 2
    line_assets = {tuple(key.path) for key in asset_keys(table)}
    for run in line_runs:
        assert run["status"] == "SUCCESS"
        assert {tuple(a["path"]) for a in run["assetSelection"]} == line_assets      # the Target column
        shown = {t["key"] for t in run["tags"] if not t["key"].startswith(("dagster/", ".dagster/"))}
        launched_by = {LAUNCHED_BY_TAG} if run["runId"] != sensor_run.run_id else set()
        assert shown == {TABLE_TAG, FIRST_SNAPSHOT_TAG, LAST_SNAPSHOT_TAG, *launched_by}, run["tags"]
        stored = instance.get_run_by_id(run["runId"]).tags                        # recorded, only hidden
        holder = Holder.from_tags(stored)
        assert holder is not None and holder.host and heartbeat_of(stored) is not None
    (sync_run,) = [r for r in line_runs if r["runId"] != sensor_run.run_id]
    assert {c["name"] for c in sync_run["assetCheckSelection"]} == {k.name for k in naming.batch_check_keys(table)}
    assert instance.get_run_by_id(sync_run["runId"]).status == DagsterRunStatus.SUCCESS
    # Launched by: the UI's column reads Dagster's sensor tag; icecdc sync's runs name the command.
    tags = {r["runId"]: {t["key"]: t["value"] for t in r["tags"]} for r in line_runs}
    assert tags[sensor_run.run_id]["dagster/sensor_name"] == naming.sensor_name(table)
    assert tags[sync_run["runId"]][LAUNCHED_BY_TAG] == Holder.current().role

    # Issue 44, 2: the batch's checks judge the line as the batch leaves it: nothing pending after the
    # sync run's batch (its own snapshot is not counted as waiting), in plain words, no ISO durations.
    checks = {c["name"]: c for c in result.data["assetNodeOrError"]["assetChecksOrError"]["checks"]}
    stuck = checks[naming.STUCK_CHECK]
    assert stuck["executionForLatestMaterialization"]["runId"] == sync_run["runId"]
    assert stuck["executionForLatestMaterialization"]["status"] == "SUCCEEDED"
    entries = {e["label"]: e for e in stuck["executionForLatestMaterialization"]["evaluation"]["metadataEntries"]}
    assert entries["pending_snapshots"]["intValue"] == 0
    # Issue 44, 8: Overview -> Timeline draws both runs: each has its times and a repository origin, the
    # sync's naming the location `dagster dev -m icecdc_dagster.definitions` loads.
    drawn = {r["id"]: r for r in timeline.data["completed"]["results"]}
    assert {r["runId"] for r in line_runs} <= set(drawn)
    for run in line_runs:
        entry = drawn[run["runId"]]
        assert entry["startTime"] and entry["endTime"] >= entry["startTime"], entry
        assert entry["repositoryOrigin"] is not None, entry
    assert drawn[sync_run["runId"]]["repositoryOrigin"]["repositoryLocationName"] == CODE_LOCATION
    assert "PT" not in stuck["description"] and "_" not in stuck["description"].replace(naming.STUCK_CHECK, "")
