"""write_mode equality_deletes through the whole ingest path (issue 30 #2): landing files and both stream
inputs give the same target as write_mode merge; a batch committed but not acknowledged is skipped by the
ledger on re-delivery (the row delta carries the batch id like a MERGE)."""

import uuid
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from icecdc_dagster.ingest import IngestSettings, ingest_files
from icecdc_dagster.ingest.ingester import ONE_JOB_MERGE_ROWS
from icecdc_dagster.steps import table_maintenance as maintenance
from tests.ingest.brokers import jetstream_subject, publish_nats, publish_redis, redis_stream
from tests.ingest.test_ingest_properties import _line, _model, deliveries
from tests.ingest.test_stream_inputs import (
    CUSTOMER_ROWS,
    CUSTOMERS,
    PG_TYPES,
    _batch_ids,
    _commit_without_ack,
    _drain,
    _nats_entry,
    _redis_entry,
    _rows,
)


def _ingest(spark, catalog, cat, landing, paths, target, mode, evolve):
    settings_ = IngestSettings(landing=str(landing), target=target, identifier_columns=("id",), auto_create=True,
                               schema_evolution=evolve, write_mode=mode)
    for path in paths:
        ingest_files(spark, cat, catalog, settings_, [path])
    assert ingest_files(spark, cat, catalog, settings_, [paths[-1]]).skipped   # a re-executed batch: no-op


@settings(max_examples=4, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=deliveries())
def test_equality_delete_target_equals_merge_target(spark, catalog, catalog_settings, tmp_path, case):
    """Random keyed streams, re-delivered runs, copied files, type-limit values, schema evolution: the
    equality-delete target reads back (Spark) as the MERGE target and the model; once compacted,
    pyiceberg reads the same rows."""
    stream, _, files, evolve = case
    cat = catalog_settings.name
    name = "p" + uuid.uuid4().hex[:8]
    landing = tmp_path / name
    landing.mkdir()
    paths = []
    for k, indices in enumerate(files):
        path = landing / f"{k:03d}.json"
        path.write_text("\n".join(_line(*stream[i]) for i in indices) + "\n")
        paths.append(str(path))
    _ingest(spark, catalog, cat, landing, paths, f"db.{name}_m", "merge", evolve)
    _ingest(spark, catalog, cat, landing, paths, f"db.{name}_e", "equality_deletes", evolve)
    if not catalog.table_exists(f"db.{name}_e"):
        assert not catalog.table_exists(f"db.{name}_m")
        return

    def read(table):
        return {r.id: (r.n, r.small, r.amount, r.label) for r in spark.table(f"{cat}.{table}").collect()}
    assert read(f"db.{name}_e") == read(f"db.{name}_m") == _model(stream, evolve)
    maintenance.compact(spark, cat, f"db.{name}_e", threshold=0)
    arrow = catalog.load_table(f"db.{name}_e").scan().to_arrow().to_pylist()
    assert {r["id"]: (r["n"], r["small"], r["amount"], r["label"]) for r in arrow} == read(f"db.{name}_e")


def test_nats_into_an_equality_delete_target_after_a_lost_ack(spark, catalog, catalog_settings):
    cat = catalog_settings.name
    with jetstream_subject() as (stream, subject):
        publish_nats(subject, CUSTOMERS[:4])
        entry = _nats_entry(stream, subject, fetch_wait="PT0.2S", max_messages=4).model_copy(
            update={"write_mode": "equality_deletes"})
        _commit_without_ack(spark, cat, entry)
        publish_nats(subject, CUSTOMERS[4:])
        runs = _drain(spark, cat, entry)
        assert runs[0].redelivered_skipped == 4
        assert _rows(spark, cat, "db.customers") == CUSTOMER_ROWS
        assert len(_batch_ids(spark, cat, entry)) == 2
        assert spark.sql(f"SELECT sum(cast(summary['added-equality-delete-files'] AS int)) "
                         f"FROM {cat}.db.customers.snapshots").first()[0] >= 2


def test_redis_into_an_equality_delete_target_equals_merge(spark, catalog, catalog_settings):
    cat = catalog_settings.name
    with redis_stream() as key:
        publish_redis(key, PG_TYPES)
        _drain(spark, cat, _redis_entry(key, "db.merged", block="PT0.1S"))
    with redis_stream() as key:
        publish_redis(key, PG_TYPES)
        entry = _redis_entry(key, "db.eqdel", block="PT0.1S").model_copy(update={"write_mode": "equality_deletes"})
        runs = _drain(spark, cat, entry)
        assert set(runs[0].result.targets["db.eqdel"].counts) >= {"upserted", "delete_keys"}
    assert _rows(spark, cat, "db.eqdel") == _rows(spark, cat, "db.merged")


ACCOUNTS = {"columns": [{"name": "id", "type": "long", "required": True}, {"name": "owner", "type": "string"},
                        {"name": "balance", "type": "decimal(10,2)"}]}


def _jobs(spark, group):
    """The names of a job group's Spark jobs (Spark's own records), e.g. ``localCheckpoint at ...``."""
    store = spark.sparkContext._jsc.sc().statusStore()
    return [str(store.job(j).name()) for j in spark.sparkContext.statusTracker().getJobIdsForGroup(group)]


def _ingest_in_group(spark, catalog, cat, settings_, path, group):
    spark.sparkContext.setJobGroup(group, group)
    try:
        return ingest_files(spark, cat, catalog, settings_, [str(path)])
    finally:
        spark.sparkContext.setJobGroup("", "")


def test_a_whole_batch_is_typed_in_its_write_and_the_others_as_before(spark, catalog, catalog_settings, tmp_path):
    """A batch the JVM typing takes whole is typed inside its write, no checkpoint (equality deletes: one job;
    a MERGE into a small target: its own jobs), with the same figures in both modes; a batch with a dead letter,
    a line for the Python rules or a snapshot marker is declined before its commit (the MERGE's staged snapshot
    discarded), its files deleted, and read again checkpointed: the rows, dead letters and figures as before,
    and no data file on disk that the table's main history does not name."""
    cat = catalog_settings.name
    landing = tmp_path / "landing"
    landing.mkdir()
    whole = landing / "a-1.json"
    whole.write_text("\n".join([
        '{"before": null, "after": {"id": 1, "owner": "ann", "balance": "12.25"}, "op": "c"}',
        '{"before": null, "after": {"id": 2, "owner": "bob", "balance": 3.5, "extra": 1}, "op": "c"}',
        '{"before": {"id": 2}, "after": null, "op": "d"}',
        '',
        '{"before": null, "after": {"id": 3, "owner": "cy", "balance": "1"}, "op": "u"}']) + "\n")
    dead = landing / "a-2.json"
    dead.write_text("\n".join([
        '{"before": null, "after": {"id": 4, "owner": "di", "balance": "1.234"}, "op": "c"}',
        '{"before": null, "after": {"id": 3, "owner": "cyd", "balance": "2.50"}, "op": "u"}']) + "\n")
    routed = landing / "a-3.json"  # a field spelled twice: the JVM typing leaves the line to the Python rules
    routed.write_text('{"before": null, "after": {"id": 5, "owner": "ed", "owner": "ed2"}, "op": "c"}\n'
                      '{"before": null, "after": {"id": 1, "owner": "ann", "balance": "13"}, "op": "u"}\n')
    marked = landing / "a-4.json"  # a Debezium snapshot's first line
    marked.write_text('{"before": null, "after": {"id": 6, "owner": "fi"}, "op": "r", "source": {"snapshot": "first"}}'
                      '\n{"before": null, "after": {"id": 7, "owner": "gu"}, "op": "r", "source": {"snapshot": "last"}}\n')
    fine = []  # whole batches after one that was not: the first read checkpointed (the line remembers), then not
    for n, key in enumerate((8, 9, 10, 11)):
        fine.append(landing / f"a-5{n}.json")
        fine[-1].write_text(f'{{"before": null, "after": {{"id": {key}, "owner": "k{key}"}}, "op": "c"}}\n')

    def entry(target, mode):
        return IngestSettings(landing=str(landing), target=target, identifier_columns=("id",), auto_create=True,
                              schema=ACCOUNTS, write_mode=mode)
    eqdel, merge = entry("db.acc_e", "equality_deletes"), entry("db.acc_m", "merge")

    def rows(table):
        return {r.id: (r.owner, None if r.balance is None else str(r.balance))
                for r in spark.table(f"{cat}.{table}").collect()}
    first = {1: ("ann", "12.25"), 3: ("cy", "1.00")}
    second = {1: ("ann", "12.25"), 3: ("cyd", "2.50")}
    third = {1: ("ann", "13.00"), 3: ("cyd", "2.50"), 5: ("ed2", None), 8: ("k8", None)}
    fourth = {6: ("fi", None), 7: ("gu", None)}  # a whole Debezium snapshot: what it lacks is deleted
    # (file, how it is read: "one" typed in its write, "declined" then read checkpointed, "checkpointed" at once,
    # rows after it)
    steps = [(whole, "one", first), (dead, "declined", second), (fine[0], "checkpointed", {**second, 8: ("k8", None)}),
             (routed, "declined", third), (fine[1], "checkpointed", {**third, 9: ("k9", None)}),
             (marked, "declined", fourth), (fine[2], "checkpointed", {**fourth, 10: ("k10", None)}),
             (fine[3], "one", {**fourth, 10: ("k10", None), 11: ("k11", None)})]
    for k, (path, how, after) in enumerate(steps):
        e = _ingest_in_group(spark, catalog, cat, eqdel, path, f"e{k}")
        m = _ingest_in_group(spark, catalog, cat, merge, path, f"m{k}")
        assert (e.events_read, e.tombstones) == (m.events_read, m.tombstones)
        figures = {name: n for name, n in m.targets["db.acc_m"].counts.items() if name in e.targets["db.acc_e"].counts}
        assert {name: e.targets["db.acc_e"].counts[name] for name in figures} == figures
        jobs = _jobs(spark, f"e{k}")
        checkpoints = [j for j in jobs if j.startswith("localCheckpoint")]
        writes = [j for j in jobs if "EqualityDeltaWriter" in j]
        merge_checkpoints = [j for j in _jobs(spark, f"m{k}") if j.startswith("localCheckpoint")]
        assert bool(checkpoints) == bool(merge_checkpoints) == (how != "one"), (k, jobs, _jobs(spark, f"m{k}"))
        assert len(writes) == (2 if how == "declined" else 1), (k, jobs)  # declined: written, then again
        assert rows("db.acc_e") == rows("db.acc_m") == after, k
    dead_letters = spark.table(f"{cat}.db.acc_e__dead_letters").collect()
    assert [(d.source_offset, "more than 2 fractional digits" in d.reason) for d in dead_letters] == [(1, True)]
    for table in ("db.acc_e", "db.acc_m"):
        loaded = catalog.load_table(table)
        named = {path for entry in loaded.history()
                 for path in loaded.inspect.files(snapshot_id=entry.snapshot_id).column("file_path").to_pylist()}
        on_disk = {f"file:{p}" for p in Path(loaded.location().removeprefix("file:"), "data").rglob("*.parquet")}
        assert on_disk and on_disk <= named, (table, sorted(on_disk - named))


def test_a_merge_target_large_against_its_batch_is_read_checkpointed_first(spark, catalog, catalog_settings, tmp_path):
    """A clean batch into a MERGE target holding more rows than ``ONE_JOB_MERGE_ROWS`` and ten times its events
    is read checkpointed first (its key range lets the MERGE skip files; reading the target whole would cost
    more than the checkpoint); a batch into the same table while it was small was typed in its MERGE. Rows as
    the events say either way."""
    cat = catalog_settings.name
    landing = tmp_path / "landing"
    landing.mkdir()
    settings_ = IngestSettings(landing=str(landing), target="db.acc_big", identifier_columns=("id",),
                               auto_create=True, schema=ACCOUNTS, write_mode="merge")
    first = landing / "b-1.json"
    first.write_text('{"before": null, "after": {"id": 1, "owner": "ann", "balance": "1.00"}, "op": "c"}\n')
    _ingest_in_group(spark, catalog, cat, settings_, first, "big0")
    assert not [j for j in _jobs(spark, "big0") if j.startswith("localCheckpoint")], _jobs(spark, "big0")
    big = ONE_JOB_MERGE_ROWS + 1000
    (spark.range(1000, 1000 + big).selectExpr("id", "concat('o', id) owner", "cast(1 as decimal(10,2)) balance")
     .writeTo(f"{cat}.db.acc_big").append())
    second = landing / "b-2.json"
    second.write_text('{"before": null, "after": {"id": 1000, "owner": "new", "balance": "2.00"}, "op": "u"}\n'
                      '{"before": {"id": 1001}, "after": null, "op": "d"}\n')
    result = _ingest_in_group(spark, catalog, cat, settings_, second, "big1")
    assert [j for j in _jobs(spark, "big1") if j.startswith("localCheckpoint")], _jobs(spark, "big1")
    assert result.targets["db.acc_big"].counts["updated"] == result.targets["db.acc_big"].counts["deleted"] == 1
    table = spark.table(f"{cat}.db.acc_big")
    assert table.count() == big  # + ann, - 1001
    assert [(r.owner, str(r.balance)) for r in table.where("id = 1000").collect()] == [("new", "2.00")]
