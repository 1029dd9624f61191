"""Stream inputs against the machine's real brokers (NATS JetStream, Redis Streams), real Spark and Iceberg.

The Debezium conformance fixtures are published to a fresh JetStream subject / Redis stream and ingested
through the input contract (read a bounded batch, commit, acknowledge); the target must hold the
hand-written rows (or the rows the landing-file path writes from the same lines). A failure between the
commit and the acknowledgement must lose nothing and write nothing twice; a dead consumer's pending
Redis entries are taken over.
"""

from pathlib import Path

import pytest
import redis

from icecdc_dagster.config import IngestConfig
from icecdc_dagster.ingest import IngestSettings, ingest_files, recorded_batches
from icecdc_dagster.inputs.registry import open_input
from icecdc_dagster.steps.ingest_entry import ingest_settings, ingest_stream_batch
from tests.helpers import TEST_SPARK_CONF, fault_env
from tests.ingest.brokers import NATS_URL, REDIS_URL, jetstream_subject, publish_nats, publish_redis, redis_stream

FIXTURES = Path(__file__).parent / "fixtures" / "debezium"
CUSTOMERS = [line.encode() for line in (FIXTURES / "mysql_tutorial_customers.jsonl").read_text().splitlines()]
PG_TYPES = [line.encode() for name in ("postgresql_types_1.jsonl", "postgresql_types_2.jsonl")
            for line in (FIXTURES / name).read_text().splitlines()]
CUSTOMER_ROWS = {  # written by hand: the tutorial's snapshot, Anne -> Anne Marie, 1004 deleted (+ tombstone)
    1001: {"id": 1001, "first_name": "Sally", "last_name": "Thomas", "email": "sally.thomas@acme.com"},
    1002: {"id": 1002, "first_name": "George", "last_name": "Bailey", "email": "gbailey@foobar.com"},
    1003: {"id": 1003, "first_name": "Edward", "last_name": "Walker", "email": "ed@walker.com"},
}


def _nats_entry(stream: str, subject: str, target: str = "db.customers", **extra) -> IngestConfig:
    return IngestConfig.model_validate({
        "name": "customers", "target": target, "identifier_columns": ["id"], "auto_create": True,
        "schema_evolution": True, "input": {"nats_jetstream": {"url": NATS_URL, "stream": stream, "subject": subject,
                                                                "durable": "icecdc_test", **extra}}})


def _redis_entry(key: str, target: str = "db.customers", **extra) -> IngestConfig:
    return IngestConfig.model_validate({
        "name": "customers", "target": target, "identifier_columns": ["id"], "auto_create": True,
        "schema_evolution": True, "input": {"redis_stream": {"url": REDIS_URL, "key": key, **extra}}})


def _rows(spark, cat, table):
    return {r.id: r.asDict(recursive=True) for r in spark.table(f"{cat}.{table}").collect()}


def _drain(spark, cat, entry):
    """Batches until the input has nothing waiting; returns the runs."""
    runs = []
    with open_input(entry.input) as reader:
        while True:
            run = ingest_stream_batch(spark, cat, entry, reader)
            runs.append(run)
            if run.result is None and not run.batch.already_committed:
                return runs


def _batch_ids(spark, cat, entry):
    return sorted(recorded_batches(spark, cat, ingest_settings(entry)))


def test_nats_customers_fixture_in_two_batches(spark, catalog, catalog_settings):
    cat = catalog_settings.name
    with jetstream_subject() as (stream, subject):
        seqs = publish_nats(subject, CUSTOMERS)
        entry = _nats_entry(stream, subject, max_messages=4, fetch_wait="PT0.2S")
        with open_input(entry.input) as reader:
            assert reader.lag().waiting == 7
        runs = _drain(spark, cat, entry)
        assert _rows(spark, cat, "db.customers") == CUSTOMER_ROWS
        first, second = runs[0].result, runs[1].result
        assert first.batch_id == f"nats-jetstream://{stream}/{subject}#{seqs[0]}..{seqs[3]}"
        assert second.batch_id == f"nats-jetstream://{stream}/{subject}#{seqs[4]}..{seqs[6]}"
        assert first.targets["db.customers"].counts["inserted"] == 4
        assert second.tombstones == 1 and second.targets["db.customers"].counts["deleted"] == 1
        assert runs[-1].lag_after.waiting == 0
        assert _batch_ids(spark, cat, entry) == sorted([first.batch_id, second.batch_id])


def test_redis_pg_types_equal_the_landing_path(spark, catalog, catalog_settings, tmp_path):
    """Schema blocks, every Debezium type mapping, a delete: the same rows as the landing files give."""
    cat = catalog_settings.name
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "001.json").write_bytes(b"\n".join(PG_TYPES) + b"\n")
    from_files = ingest_files(spark, cat, catalog, IngestSettings(str(landing), "db.from_files", ("id",), True, None,
                                                                  True), [str(landing / "001.json")])
    with redis_stream() as key:
        ids = publish_redis(key, PG_TYPES)
        entry = _redis_entry(key, "db.from_redis", block="PT0.1S")
        runs = _drain(spark, cat, entry)
        assert runs[0].result.batch_id == f"redis-stream://{key}#{ids[0]}..{ids[-1]}"
        assert runs[0].result.totals() == from_files.totals()  # 3 events, 2 upserts, one insert cancelled by its
        assert runs[0].result.totals()["dead_lettered"] == 0     # delete inside the batch, nothing dead-lettered
    assert _rows(spark, cat, "db.from_redis") == _rows(spark, cat, "db.from_files")
    files_types = [(f.name, f.dataType) for f in spark.table(f"{cat}.db.from_files").schema.fields]
    assert [(f.name, f.dataType) for f in spark.table(f"{cat}.db.from_redis").schema.fields] == files_types


class _AckLost(Exception):
    pass


def _commit_without_ack(spark, cat, entry):
    """One batch committed, then the acknowledgement fails (the process 'dies' with the broker's delivery
    outstanding): the reader's connection is dropped without an ack."""
    reader = open_input(entry.input)

    def die(batch):  # noqa: ANN001, ANN202
        raise _AckLost(batch.batch_id)

    reader.acknowledge = die
    try:
        with pytest.raises(_AckLost):
            ingest_stream_batch(spark, cat, entry, reader)
    finally:
        reader.close()


def test_nats_failure_between_commit_and_ack_loses_nothing_and_writes_nothing_twice(spark, catalog,
                                                                                   catalog_settings):
    cat = catalog_settings.name
    with jetstream_subject() as (stream, subject):
        publish_nats(subject, CUSTOMERS[:4])
        entry = _nats_entry(stream, subject, fetch_wait="PT0.2S")
        _commit_without_ack(spark, cat, entry)
        [committed] = _batch_ids(spark, cat, entry)
        publish_nats(subject, CUSTOMERS[4:])            # the stream goes on while the batch is unacknowledged
        runs = _drain(spark, cat, entry)
        assert runs[0].redelivered_skipped == 4 and runs[0].result.batch_id != committed
        assert _rows(spark, cat, "db.customers") == CUSTOMER_ROWS
        assert len(_batch_ids(spark, cat, entry)) == 2  # the first batch is in the ledger once
        inserted = spark.sql(f"SELECT count(*) FROM {cat}.db.customers.snapshots "
                             "WHERE summary['icecdc.batch-id'] IS NOT NULL").first()[0]
        assert inserted == 2
        assert runs[-1].lag_after.waiting == 0


def test_redis_failure_between_commit_and_ack_loses_nothing_and_writes_nothing_twice(spark, catalog,
                                                                                    catalog_settings):
    cat = catalog_settings.name
    with redis_stream() as key:
        publish_redis(key, CUSTOMERS[:4])
        entry = _redis_entry(key, block="PT0.1S")
        _commit_without_ack(spark, cat, entry)
        publish_redis(key, CUSTOMERS[4:])
        runs = _drain(spark, cat, entry)
        assert runs[0].redelivered_skipped == 4 and runs[0].result is None  # pending first, skipped by the ledger
        assert _rows(spark, cat, "db.customers") == CUSTOMER_ROWS
        assert len(_batch_ids(spark, cat, entry)) == 2
        assert runs[-1].lag_after.waiting == 0


def test_redis_dead_consumers_pending_entries_are_taken_over(spark, catalog, catalog_settings):
    cat = catalog_settings.name
    with redis_stream() as key:
        ids = publish_redis(key, CUSTOMERS)
        client = redis.Redis.from_url(REDIS_URL)
        client.xgroup_create(key, "icecdc", id="0")
        held = client.xreadgroup("icecdc", "worker-that-died", {key: ">"}, count=4)  # delivered, never acked
        assert [i.decode() for i, _ in held[0][1]] == ids[:4]
        entry = _redis_entry(key, block="PT0.1S")
        with open_input(entry.input) as reader:
            assert (reader.lag().pending, reader.lag().unacknowledged) == (3, 4)
        runs = _drain(spark, cat, entry)
        assert runs[0].result.batch_id.endswith(f"#{ids[0]}..{ids[3]}")  # the taken-over entries first, in order
        assert _rows(spark, cat, "db.customers") == CUSTOMER_ROWS
        assert client.xpending(key, "icecdc")["pending"] == 0
        client.close()


def test_stream_input_config_is_validated_like_the_rest():
    from pydantic import ValidationError

    base = {"name": "c", "target": "db.c"}
    nats = {"nats_jetstream": {"stream": "S", "subject": "a.b", "durable": "d"}}
    assert IngestConfig.model_validate({**base, "input": nats}).source == "nats-jetstream://S/a.b"
    for bad, says in [({**base}, "exactly one of 'landing'"),
                      ({**base, "landing": "/x", "input": nats}, "exactly one of 'landing'"),
                      ({**base, "input": {"kafka": {}}}, "unknown input type (expected one of: landing, nats_jetstream, "
                                                         "redis_stream)"),
                      ({**base, "input": {"redis_stream": {"key": "k", "password": "plain"}}}, "env"),
                      ({**base, "input": {"nats_jetstream": {**nats["nats_jetstream"], "max_messages": 0}}},
                       "greater than or equal to 1"),
                      ({**base, "input": {"redis_stream": {"key": "k", "block": "1s"}}}, "duration")]:
        with pytest.raises(ValidationError, match=None) as error:
            IngestConfig.model_validate(bad)
        assert says in str(error.value), str(error.value)


def test_ledger_positions_skip_redeliveries_and_rebuild_a_partial_batch():
    from icecdc_dagster.errors import StreamInputError
    from icecdc_dagster.inputs.base import Message, ledger_view, split_batch
    from icecdc_dagster.inputs.redis_stream.reader import entry_key

    src = "redis-stream://k"
    msgs = [Message(p, b"{}") for p in ("9-0", "10-0", "10-1", "11-0")]
    complete = ledger_view(src, {f"{src}#1-0..10-0": True, "other#1-0..99-0": True}, entry_key)
    assert complete.committed_through == (10, 0)           # numeric, not text order ("9-0" > "10-0" as text)
    batch = split_batch(src, msgs, complete, entry_key)
    assert [m.position for m in batch.already_committed] == ["9-0", "10-0"]
    assert batch.batch_id == f"{src}#10-1..11-0"
    partial = ledger_view(src, {f"{src}#1-0..10-0": True, f"{src}#10-1..10-1": False}, entry_key)
    rebuilt = split_batch(src, msgs, partial, entry_key)
    assert rebuilt.batch_id == f"{src}#10-1..10-1" and [m.position for m in rebuilt.messages] == ["10-1"]
    with pytest.raises(StreamInputError, match="committed to only some of its tables"):
        split_batch(src, msgs[:2], partial, entry_key)


def _event(op, row=None, before=None, snapshot="false"):
    import json

    return json.dumps({"payload": {"op": op, "before": before, "after": row, "ts_ms": 1,
                                   "source": {"db": "shop", "table": "c", "snapshot": snapshot}}}).encode()


def test_snapshot_then_stream_hand_off_also_when_the_snapshot_is_re_sent(spark, catalog, catalog_settings):
    """Debezium's snapshot (``op: r``) arrives before the stream and overlaps it (a row inserted while the
    snapshot ran is both read and streamed); the connector then re-sends its snapshot (``snapshot.mode`` always,
    or a restart before the offset was flushed): the target equals the source after every hand-off."""
    cat = catalog_settings.name
    snapshot = [_event("r", {"id": 1, "v": "a"}, snapshot="first"), _event("r", {"id": 2, "v": "b"}, snapshot="true"),
                _event("r", {"id": 3, "v": "c"}, snapshot="last")]
    stream = [_event("c", {"id": 3, "v": "c"}),                              # overlaps the snapshot's last row
              _event("u", {"id": 1, "v": "a2"}, before={"id": 1, "v": "a"}),
              _event("d", None, before={"id": 2, "v": "b"}), b"",           # delete + tombstone
              _event("c", {"id": 4, "v": "d"})]
    resent = [_event("r", {"id": 1, "v": "a2"}, snapshot="first"), _event("r", {"id": 3, "v": "c"}, snapshot="true"),
              _event("r", {"id": 4, "v": "d"}, snapshot="last")]
    after_resend = [_event("u", {"id": 4, "v": "d2"}, before={"id": 4, "v": "d"})]
    source = {1: "a2", 3: "c", 4: "d"}
    with redis_stream() as key:
        entry = _redis_entry(key, "db.handoff", block="PT0.1S", max_messages=5)  # batches cut across the hand-off
        publish_redis(key, snapshot[:2])
        _drain(spark, cat, entry)
        publish_redis(key, snapshot + stream)  # the first snapshot attempt died: Debezium sends it whole again
        _drain(spark, cat, entry)
        assert {r.id: r.v for r in spark.table(f"{cat}.db.handoff").collect()} == source
        publish_redis(key, resent)
        _drain(spark, cat, entry)
        assert {r.id: r.v for r in spark.table(f"{cat}.db.handoff").collect()} == source
        publish_redis(key, after_resend)
        _drain(spark, cat, entry)
        assert {r.id: r.v for r in spark.table(f"{cat}.db.handoff").collect()} == {**source, 4: "d2"}


KILLED_STEP = f"TEST_SPARK_CONF = {TEST_SPARK_CONF!r}\n" + """
import sys
from icecdc_dagster.config import IngestConfig
from icecdc_dagster.steps.ingest_entry import ingest_stream_batch
from icecdc_dagster.inputs.registry import open_input
from icecdc_dagster.runtime.catalog import CatalogSettings
from icecdc_dagster.runtime.spark import SparkSettings, attach_catalog, build_spark_session

name, uri, warehouse, entry_json = sys.argv[1:5]
spark = build_spark_session(SparkSettings(master="local[1]", app_name="killed-step",
                                          conf=TEST_SPARK_CONF))
attach_catalog(spark, CatalogSettings(name=name, uri=uri, warehouse=warehouse))
entry = IngestConfig.model_validate_json(entry_json)
with open_input(entry.input) as reader:
    ingest_stream_batch(spark, name, entry, reader)   # the fault hook kills the process after the commit
print("acknowledged", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["nats", "redis"])
def test_sigkill_between_commit_and_ack_loses_nothing_and_writes_nothing_twice(spark, catalog, catalog_settings,
                                                                              kind):
    """The real thing: a process SIGKILLed by the fault hook right after the commit, before the acknowledgement."""
    import subprocess
    import sys

    cat = catalog_settings.name
    with (jetstream_subject() if kind == "nats" else redis_stream()) as where:
        if kind == "nats":
            publish_nats(where[1], CUSTOMERS[:4])
            entry = _nats_entry(*where, fetch_wait="PT0.2S")
        else:
            publish_redis(where, CUSTOMERS[:4])
            entry = _redis_entry(where, block="PT0.1S")
        env = fault_env("kill-after-commit-before-ack")
        done = subprocess.run([sys.executable, "-c", KILLED_STEP, cat, catalog_settings.uri,
                               catalog_settings.warehouse, entry.model_dump_json(by_alias=True)],
                              env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == -9 and "acknowledged" not in done.stdout, done.stderr[-2000:]
        [committed] = _batch_ids(spark, cat, entry)
        (publish_nats(where[1], CUSTOMERS[4:]) if kind == "nats" else publish_redis(where, CUSTOMERS[4:]))
        runs = _drain(spark, cat, entry)
        assert runs[0].redelivered_skipped == 4
        assert _rows(spark, cat, "db.customers") == CUSTOMER_ROWS
        ids = _batch_ids(spark, cat, entry)
        assert committed in ids and len(ids) == 2
        assert runs[-1].lag_after.waiting == 0
