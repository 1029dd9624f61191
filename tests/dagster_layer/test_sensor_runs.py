"""The per-table sensor with a real instance, real runs, real Spark and Iceberg:
snapshots become partitions in commit order and are materialised strictly in order; a run
whose worker process is killed is failed over by the next tick and retried."""

import os
import random
import signal
import sys
import time

from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterRunStatus

from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.lease.holder import Holder
from icecdc_dagster.lease.line_lock import LineLock
from icecdc_dagster.sinks.iceberg import SOURCE_SNAPSHOT_PROPERTY
from tests.dagster_layer.harness import create_launchable_run, drain, start_run_worker, tick
from tests.helpers import write_pipeline


def _snapshot_ids(catalog, name):
    return [str(s.snapshot_id) for s in catalog.load_table(name).snapshots()]


def _metadata(instance, key, partition):
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=key, asset_partitions=[partition]),
                                              limit=1).records
    assert records, f"{key.to_user_string()} [{partition}] was not materialised"
    return {k: getattr(v, "value", v) for k, v in records[0].asset_materialization.metadata.items()}


def _one_table(spark, catalog_settings, tmp_path, table_name: str):  # noqa: ANN001, ANN202
    """A keyed v2 table with one row, and the definitions of a pipeline syncing it: (defs, table, sensor)."""
    from icecdc_dagster.assets import naming

    name = catalog_settings.name
    spark.sql(f"CREATE TABLE {name}.db.{table_name} (id BIGINT NOT NULL, v STRING) USING iceberg "
              "TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {name}.db.{table_name} VALUES (1, 'a')")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": f"db.{table_name}", "identifier_columns": ["id"]}]))
    defs = build_definitions(config)
    table = config.tables[0]
    return defs, table, defs.get_sensor_def(naming.sensor_name(table))


def test_sensor_requests_every_snapshot_in_commit_order(spark, catalog_settings, catalog, instance, tmp_path):
    name = catalog_settings.name
    t = f"{name}.db.items"
    spark.sql(f"""CREATE TABLE {t} (id BIGINT NOT NULL, name STRING, qty INT) USING iceberg
                  PARTITIONED BY (bucket(2, id))
                  TBLPROPERTIES ('format-version'='2', 'write.update.mode'='copy-on-write',
                                 'write.delete.mode'='merge-on-read')""")
    spark.sql(f"INSERT INTO {t} SELECT id, concat('n', id), CAST(id AS INT) FROM range(0, 40)")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": "db.items", "identifier_columns": ["id"], "max_snapshots_per_run": 1, "max_retries": 0}]))
    defs = build_definitions(config)
    table = config.tables[0]
    changelog_key = AssetKey(["changelog", "db", "items_changelog"])

    first = tick(defs, instance, table)
    bootstrap = _snapshot_ids(catalog, "db.items")[-1]
    assert first.added == [bootstrap] and first.requested == [(bootstrap, bootstrap)] and first.succeeded == [True]
    assert _metadata(instance, changelog_key, bootstrap)["count_insert"] == 40

    spark.sql(f"UPDATE {t} SET qty = qty + 100 WHERE id < 5")                     # CoW update
    spark.sql(f"DELETE FROM {t} WHERE id >= 35")                                   # MoR delete
    spark.sql(f"CALL {name}.system.rewrite_data_files(table => 'db.items', options => map('rewrite-all','true'))")
    spark.sql(f"ALTER TABLE {t} ADD COLUMN note STRING")                           # schema change
    spark.sql(f"INSERT INTO {t} VALUES (100, 'new', 1, 'with note')")             # append after it
    later = _snapshot_ids(catalog, "db.items")[1:]
    assert len(later) == 4

    ticks = drain(defs, instance, table)
    assert ticks[0].added == later
    assert [t_.requested for t_ in ticks if t_.requested] == [[(k, k)] for k in later]
    assert all(all(t_.succeeded) for t_ in ticks)
    assert ticks[-1].requested == [] and "applied" in (ticks[-1].skip_reason or "")

    update, delete, replace, append = (_metadata(instance, changelog_key, k) for k in later)
    # The stored changelog keeps both images of every update (sinks read the after image).
    assert not {"update_before_rows", "insert_rows", "snapshots", "carry_over_groups_in_arrow"} & set(update)
    assert (update["count_update_before"], update["count_update_after"], update["count_insert"], update["rows"]) \
        == (5, 5, 0, 10)
    assert update["operation"] == "overwrite"
    assert update["parent_snapshot_id"] == bootstrap and update["snapshot_id"] == later[0]
    assert update["files_read"] >= 1 and update["rows_read"] >= 10 and update["carry_over_removed"] >= 0
    assert update["rows_read"] - update["carry_over_removed"] == update["rows"]  # carry-over pairs: 2 rows each
    assert update["changelog_table"] == "db.items__changelog" and update["changelog_snapshot_id"].isdigit()
    assert {"commit_time", "lag_commit_to_applied_s", "duration_s", "count_delete"} <= set(update)
    assert delete["count_delete"] == 5 and delete["count_insert"] == 0
    assert replace["operation"] == "replace" and replace["rows"] == 0
    assert append["count_insert"] == 1
    # One-sided snapshots have nothing to cancel: rows read = rows stored, counted by the write itself.
    assert (append["count_insert"], append["rows_read"], append["carry_over_removed"]) == (1, 1, 0)
    assert delete["count_delete"] == 5 and delete["rows_read"] - delete["carry_over_removed"] == delete["rows"]


def test_catch_up_range_runs_net_changes_in_one_run(spark, catalog_settings, catalog, instance, tmp_path):
    t = f"{catalog_settings.name}.db.items"
    spark.sql(f"CREATE TABLE {t} (id BIGINT NOT NULL, v STRING) USING iceberg TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"ALTER TABLE {t} SET IDENTIFIER FIELDS id")   # no identifier_columns in the config: the
    spark.sql(f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")   # table's identifier fields are the key
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": "db.items", "max_snapshots_per_run": 3}]))
    defs = build_definitions(config)
    table = config.tables[0]
    assert tick(defs, instance, table).succeeded == [True]
    spark.sql(f"INSERT INTO {t} VALUES (3, 'c')")
    spark.sql(f"UPDATE {t} SET v = 'c2' WHERE id = 3")
    spark.sql(f"DELETE FROM {t} WHERE id = 3")      # insert, update, delete of 3 inside the range: nothing
    spark.sql(f"UPDATE {t} SET v = 'a2' WHERE id = 1")
    keys = _snapshot_ids(catalog, "db.items")[1:]
    ticks = drain(defs, instance, table)
    assert [t_.requested for t_ in ticks if t_.requested] == [[(keys[0], keys[2])], [(keys[3], keys[3])]]
    assert all(all(t_.succeeded) for t_ in ticks)
    net = _metadata(instance, AssetKey(["changelog", "db", "items_changelog"]), keys[0])
    assert net["batch_kind"] == "net" and net["rows"] == 0
    assert _metadata(instance, AssetKey(["changelog", "db", "items_changelog"]), keys[3])["count_update_after"] == 1


def test_killed_sensor_launched_run_is_failed_over_by_the_next_tick(spark, catalog_settings, catalog, instance,
                                                                    tmp_path):
    """A sensor's run executing in its own run worker process (``dagster api execute_run``, as
    Dagster's default launcher starts it) is SIGKILLed mid-batch; the next sensor tick fails the
    run over (FAILURE, the dead worker named in its event log) and requests the retry, which
    leaves the replica equal to the source with the export committed once."""
    t = f"{catalog_settings.name}.db.items"
    spark.sql(f"CREATE TABLE {t} (id BIGINT NOT NULL, v STRING) USING iceberg TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {t} SELECT id, concat('v', id) FROM range(0, 20000)")
    config_path = write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": "db.items", "identifier_columns": ["id"], "max_retries": 1,
         "sinks": [{"iceberg": {"table_name": "db.items_copy"}}]}])
    defs = build_definitions(load_config(config_path))
    table = load_config(config_path).tables[0]
    first = tick(defs, instance, table, run=False)
    (request,) = first.run_requests
    run = create_launchable_run(defs, instance, request)
    worker = start_run_worker(instance, run, {**os.environ, "ICECDC_CONFIG": str(config_path)}, tmp_path / "worker.log")
    try:
        while not instance.all_logs(run.run_id, of_type=DagsterEventType.STEP_START):   # mid-batch
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            time.sleep(0.05)
        time.sleep(random.Random(18).uniform(0, 2))
        holder = Holder.from_tags(instance.get_run_by_id(run.run_id).tags)
        assert holder.pid == worker.pid and holder.role == "run worker"
        assert LineLock.for_instance(instance, "db.items").is_busy()       # the run worker holds the line
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    finally:
        worker.kill()
    assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.STARTED    # what Dagster alone leaves

    retry = tick(defs, instance, table)
    assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.FAILURE
    (failure,) = instance.all_logs(run.run_id, of_type=DagsterEventType.PIPELINE_FAILURE)
    assert f"worker {holder.host}:{holder.pid} (run worker) died" in failure.message
    assert retry.requested == first.requested and retry.succeeded == [True]
    assert retry.run_requests[0].run_key.endswith("attempt-2") and request.run_key.endswith("attempt-1")
    assert not LineLock.for_instance(instance, "db.items").is_busy()
    source, copy = spark.table(t), spark.table(f"{catalog_settings.name}.db.items_copy")
    assert copy.count() == 20000 and source.exceptAll(copy).count() == 0 and copy.exceptAll(source).count() == 0
    applied = [s.summary.additional_properties.get(SOURCE_SNAPSHOT_PROPERTY)
               for s in catalog.load_table("db.items_copy").snapshots()]
    assert [a for a in applied if a] == [first.added[0]]                # the export committed exactly once


def test_idle_line_skips_its_queries_until_the_table_or_the_line_changes(spark, catalog_settings, catalog, instance,
                                                                         tmp_path):
    from dagster import build_sensor_context

    from icecdc_dagster.assets import naming
    from icecdc_dagster.sensors.snapshots import IDLE_RECHECK_S, NOT_IDLE, UNCHANGED_SKIP, idle_cursor, idle_fingerprint

    name = catalog_settings.name
    defs, table, sensor = _one_table(spark, catalog_settings, tmp_path, "quiet")

    def evaluate(cursor):  # noqa: ANN001, ANN202
        context = build_sensor_context(instance=instance, instance_ref=instance.get_ref(), cursor=cursor,
                                       resources=defs.resources, definitions=defs)
        return sensor.evaluate_tick(context)

    assert all(all(t.succeeded) for t in drain(defs, instance, table))
    full = evaluate(None)
    assert full.skip_message == "all snapshots are applied" and not full.run_requests
    mark = full.cursor
    assert mark is not None
    quick = evaluate(mark)
    assert quick.skip_message == UNCHANGED_SKIP and not quick.run_requests and quick.cursor == mark

    # A commit changes the table's metadata file: a full check adds the snapshot and requests its run.
    spark.sql(f"INSERT INTO {name}.db.quiet VALUES (2, 'b')")
    changed = evaluate(mark)
    newest = _snapshot_ids(catalog, "db.quiet")[-1]
    assert changed.skip_message is None and [r.partition_key for r in changed.run_requests] == [newest]
    assert changed.cursor == NOT_IDLE  # the idle mark is cleared
    assert all(all(t.succeeded) for t in drain(defs, instance, table))

    # Time ends the mark. A partition added from outside while the table stands still (a resync's, which
    # applies it itself) is planned by the next full check, IDLE_RECHECK_S at most: the idle tick reads none.
    source = catalog.load_table("db.quiet")
    mark = idle_cursor(idle_fingerprint(table, source))
    assert evaluate(mark).skip_message == UNCHANGED_SKIP
    stale = idle_cursor(idle_fingerprint(table, source), now=time.time() - IDLE_RECHECK_S - 1)
    assert evaluate(stale).skip_message == "all snapshots are applied"
    instance.add_dynamic_partitions(naming.partitions_name(table), [f"{newest}@resync1"])
    assert evaluate(mark).skip_message == UNCHANGED_SKIP
    planned = evaluate(stale)
    assert [r.partition_key for r in planned.run_requests] == [f"{newest}@resync1"]


def test_batch_runs_read_the_backlog_not_every_key(spark, catalog_settings, catalog, instance, tmp_path, monkeypatch):
    """After the first batch, a run finds its line from the latest batch and the keys after it
    (newest first), not from every partition key of the table; what it computes is unchanged."""
    from dagster import DagsterInstance

    name = catalog_settings.name
    spark.sql(f"CREATE TABLE {name}.db.hist (id BIGINT NOT NULL, v STRING) USING iceberg "
              "TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {name}.db.hist VALUES (1, 'a')")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": "db.hist", "identifier_columns": ["id"], "max_snapshots_per_run": 2}]))
    defs = build_definitions(config)
    table = config.tables[0]
    assert all(all(t.succeeded) for t in drain(defs, instance, table))   # the export
    callers = []
    real = DagsterInstance.get_dynamic_partitions

    def recording(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202 - the real call, recorded
        callers.append(sys._getframe(1).f_code.co_name)  # noqa: SLF001
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DagsterInstance, "get_dynamic_partitions", recording)
    for i in range(2, 5):
        spark.sql(f"INSERT INTO {name}.db.hist VALUES ({i}, 'v{i}')")
    keys = _snapshot_ids(catalog, "db.hist")[1:]
    ticks = drain(defs, instance, table)
    assert all(all(t.succeeded) for t in ticks)
    assert [r for t in ticks for r in t.requested] == [(keys[0], keys[1]), (keys[2], keys[2])]
    assert "batch_request" not in callers
    changelog_key = AssetKey(["changelog", "db", "hist_changelog"])
    net, last = _metadata(instance, changelog_key, keys[1]), _metadata(instance, changelog_key, keys[2])
    assert (net["batch_kind"], net["count_insert"], net["is_export"]) == ("net", 2, False)
    assert (last["batch_kind"], last["count_insert"], last["is_export"]) == ("cdc", 1, False)


def test_code_server_ticks_share_one_instance_and_build_no_resources(spark, catalog_settings, catalog, instance,
                                                                    tmp_path):
    """A tick as Dagster's code server evaluates it (an instance ref, the resources the sensor requires):
    no resource is built for it and every tick uses this process's one instance for the ref, not a new
    instance (and its storage checks) per tick. The ticks decide as before: idle, then a new snapshot."""
    from dagster import build_sensor_context

    from icecdc_dagster.lines import line
    from icecdc_dagster.sensors.snapshots import UNCHANGED_SKIP

    name = catalog_settings.name
    defs, table, sensor = _one_table(spark, catalog_settings, tmp_path, "served")
    assert not sensor.required_resource_keys
    assert all(all(t.succeeded) for t in drain(defs, instance, table))

    contexts = []

    def evaluate(cursor):  # noqa: ANN001, ANN202
        # As the code server builds it: an instance ref, and only the resources the sensor requires.
        required = {k: v for k, v in (defs.resources or {}).items() if k in sensor.required_resource_keys}
        context = build_sensor_context(instance_ref=instance.get_ref(), cursor=cursor, resources=required,
                                       definitions=defs)
        contexts.append(context)
        return sensor.evaluate_tick(context)

    full = evaluate(None)
    assert full.skip_message == "all snapshots are applied"
    assert evaluate(full.cursor).skip_message == UNCHANGED_SKIP
    spark.sql(f"INSERT INTO {name}.db.served VALUES (2, 'b')")
    changed = evaluate(full.cursor)
    assert [r.partition_key for r in changed.run_requests] == [_snapshot_ids(catalog, "db.served")[-1]]
    shared = {id(c.instance) for c in contexts}
    assert len(shared) == 1 and contexts[0].instance is not instance  # one instance, built from the ref
    assert contexts[0].instance in line._INSTANCES.values()  # noqa: SLF001 - the process's instance for the ref


def test_one_sensor_for_all_tables_ticks_each_line_at_its_own_interval(spark, catalog_settings, catalog, instance,
                                                                      tmp_path):
    """``snapshot_sensors: one``: one sensor plans both lines (their runs succeed and apply each table's
    snapshots), and a table whose polling interval has not passed is not ticked."""
    import json

    from dagster import build_sensor_context

    from icecdc_dagster.sensors.snapshots import ALL_TABLES_SENSOR

    name = catalog_settings.name
    for table_name in ("fast", "slow"):
        spark.sql(f"CREATE TABLE {name}.db.{table_name} (id BIGINT NOT NULL, v STRING) USING iceberg "
                  "TBLPROPERTIES ('format-version'='2')")
        spark.sql(f"INSERT INTO {name}.db.{table_name} VALUES (1, 'a')")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": "db.fast", "identifier_columns": ["id"], "polling_interval": "PT5S"},
        {"table_name": "db.slow", "identifier_columns": ["id"], "polling_interval": "PT1M"}],
        snapshot_sensors="one"))
    defs = build_definitions(config)
    assert [s.name for s in defs.sensors] == [ALL_TABLES_SENSOR]
    sensor = defs.get_sensor_def(ALL_TABLES_SENSOR)
    job = defs.resolve_implicit_global_asset_job_def()

    def evaluate(cursor):  # noqa: ANN001, ANN202 - one tick as the daemon runs it, then its runs
        result = sensor.evaluate_tick(build_sensor_context(instance=instance, instance_ref=instance.get_ref(),
                                                           cursor=cursor, definitions=defs))
        for request in result.dynamic_partitions_requests or []:
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        for request in result.run_requests:
            assert job.execute_in_process(instance=instance, partition_key=request.partition_key,
                                          asset_selection=request.asset_selection, tags=request.tags).success
        return result

    first = evaluate(None)
    heads = {t: str(catalog.load_table(f"db.{t}").current_snapshot().snapshot_id) for t in ("fast", "slow")}
    assert sorted(r.partition_key for r in first.run_requests) == sorted(heads.values())
    for table_name in ("fast", "slow"):
        spark.sql(f"INSERT INTO {name}.db.{table_name} VALUES (2, 'b')")
    marks = json.loads(first.cursor)
    assert set(marks) == {"db.fast", "db.slow"}
    marks["db.fast"]["at"] -= 10  # 10 s later: past fast's interval (PT5S), not slow's (PT1M)
    second = evaluate(json.dumps(marks))
    fast_head = str(catalog.load_table("db.fast").current_snapshot().snapshot_id)
    assert [r.partition_key for r in second.run_requests] == [fast_head]
    assert json.loads(second.cursor)["db.slow"] == marks["db.slow"]  # not ticked: its mark unchanged
    assert _metadata(instance, AssetKey(["changelog", "db", "fast_changelog"]), fast_head)["count_insert"] == 1

    # Idle: the next tick of fast finds nothing new and marks it; the one after compares the catalog's record
    # (every due table's in one query) and skips; a commit moves the record and is planned.
    from icecdc_dagster.sensors.snapshots import UNCHANGED_SKIP

    def later(result):  # noqa: ANN001, ANN202 - the next tick, past fast's interval
        marks = json.loads(result.cursor)
        marks["db.fast"]["at"] -= 10
        return evaluate(json.dumps(marks))

    idle = later(second)
    assert not idle.run_requests and json.loads(idle.cursor)["db.fast"]["cursor"].startswith('{"idle"')
    skipped = later(idle)
    assert not skipped.run_requests and f"db.fast: {UNCHANGED_SKIP}" in skipped.skip_message
    spark.sql(f"INSERT INTO {name}.db.fast VALUES (3, 'c')")
    moved = later(skipped)
    assert [r.partition_key for r in moved.run_requests] == [
        str(catalog.load_table("db.fast").current_snapshot().snapshot_id)]


def test_one_sensor_rechecks_the_longest_idle_line_first_one_a_tick(spark, catalog_settings, catalog, instance,
                                                                   tmp_path):
    """``snapshot_sensors: one``: idle lines whose marks expired are fully checked one a tick, the longest idle
    first; the others keep their marks (their tables unchanged) until their turn. A table that moves is
    planned at once, whatever its turn."""
    import json

    from dagster import build_sensor_context

    from icecdc_dagster.sensors.snapshots import ALL_TABLES_SENSOR, IDLE_RECHECK_S, idle_since

    name = catalog_settings.name
    tables = ("a", "b", "c")
    for t in tables:
        spark.sql(f"CREATE TABLE {name}.db.{t} (id BIGINT NOT NULL) USING iceberg TBLPROPERTIES ('format-version'='2')")
        spark.sql(f"INSERT INTO {name}.db.{t} VALUES (1)")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": f"db.{t}", "identifier_columns": ["id"], "polling_interval": "PT5S"} for t in tables],
        snapshot_sensors="one"))
    defs = build_definitions(config)
    sensor = defs.get_sensor_def(ALL_TABLES_SENSOR)
    job = defs.resolve_implicit_global_asset_job_def()

    def evaluate(marks):  # noqa: ANN001, ANN202 - one tick past every interval, then its runs
        for mark in (marks or {}).values():
            mark["at"] -= 10
        result = sensor.evaluate_tick(build_sensor_context(instance=instance, instance_ref=instance.get_ref(),
                                                           cursor=json.dumps(marks) if marks else None,
                                                           definitions=defs))
        for request in result.dynamic_partitions_requests or []:
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        for request in result.run_requests:
            assert job.execute_in_process(instance=instance, partition_key=request.partition_key,
                                          asset_selection=request.asset_selection, tags=request.tags).success
        return result, json.loads(result.cursor)

    _, marks = evaluate(None)                  # the exports
    _, marks = evaluate(marks)                 # nothing to do: every line marked idle
    since = {t: idle_since(marks[f"db.{t}"]["cursor"]) for t in tables}
    assert all(v is not None for v in since.values())
    for age, t in ((3, "b"), (2, "a"), (1, "c")):  # expired, b the longest idle
        mark = json.loads(marks[f"db.{t}"]["cursor"])
        mark["at"] = time.time() - IDLE_RECHECK_S - age
        marks[f"db.{t}"]["cursor"] = json.dumps(mark)
    order = []
    for _ in tables:
        before = {t: marks[f"db.{t}"]["cursor"] for t in tables}
        result, marks = evaluate(marks)
        assert not result.run_requests
        checked = [t for t in tables if marks[f"db.{t}"]["cursor"] != before[t]]
        assert len(checked) == 1 and idle_since(marks[f"db.{checked[0]}"]["cursor"]) > time.time() - 5
        order += checked
    assert order == ["b", "a", "c"]
    mark = json.loads(marks["db.a"]["cursor"])  # expired again, but its table moves: planned now, not in turn
    mark["at"] = time.time() - IDLE_RECHECK_S - 9
    marks["db.a"]["cursor"] = json.dumps(mark)
    spark.sql(f"INSERT INTO {name}.db.c VALUES (2)")
    result, _ = evaluate(marks)
    assert [r.partition_key for r in result.run_requests] == [
        str(catalog.load_table("db.c").current_snapshot().snapshot_id)]
