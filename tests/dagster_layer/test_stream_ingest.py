"""A stream input as a Dagster asset, with the real sensor, runs, NATS JetStream, Spark and Iceberg: the sensor
requests a run while messages wait (the partition is the first waiting position), each run ingests one bounded
batch and reports its range and the consumer lag, and ``icecdc status`` shows the lag."""

from pathlib import Path

from dagster import AssetKey, AssetRecordsFilter

from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.status import ingest_status
from tests.dagster_layer.harness import drain_sensor
from tests.helpers import write_pipeline
from tests.ingest.brokers import NATS_URL, jetstream_subject, publish_nats

INGEST = AssetKey(["ingest", "customers_nats"])
SENSOR = "landing__customers_nats"
FIXTURE = Path(__file__).parent.parent / "ingest" / "fixtures" / "debezium" / "mysql_tutorial_customers.jsonl"


def test_nats_input_sensor_runs_and_lag(spark, catalog_settings, catalog, instance, tmp_path):
    cat = catalog_settings.name
    lines = [line.encode() for line in FIXTURE.read_text().splitlines()]
    with jetstream_subject() as (stream, subject):
        seqs = publish_nats(subject, lines)
        config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [], ingest=[{
            "name": "customers_nats", "target": "db.customers", "identifier_columns": ["id"], "auto_create": True,
            "input": {"nats_jetstream": {"url": NATS_URL, "stream": stream, "subject": subject, "durable": "icecdc",
                                         "max_messages": 4, "fetch_wait": "PT0.2S"}}}]))
        defs = build_definitions(config)
        before = ingest_status(instance, config.ingest[0])
        assert (before.consumer_lag, before.not_ingested) == (7, [str(seqs[0])])
        assert "consumer lag 7 messages" in before.render()

        ticks = drain_sensor(defs, instance, SENSOR, [INGEST])
        assert [t.requested for t in ticks if t.requested] == [[(str(seqs[0]),) * 2], [(str(seqs[4]),) * 2]]
        assert all(all(t.succeeded) for t in ticks) and ticks[-1].skip_reason == "no message waits"
        records = instance.fetch_materializations(AssetRecordsFilter(asset_key=INGEST), limit=2).records
        newest, first = ({k: getattr(v, "value", v) for k, v in r.asset_materialization.metadata.items()}
                         for r in records)
        assert (first["first_position"], first["last_position"], first["messages"]) == (str(seqs[0]), str(seqs[3]), 4)
        assert first["consumer_lag"] == 3 and newest["consumer_lag"] == 0
        assert newest["icecdc/batch_id"] == f"nats-jetstream://{stream}/{subject}#{seqs[4]}..{seqs[6]}"
        assert newest["tombstones"] == 1 and newest["deleted"] == 1
        assert sorted(r.id for r in spark.table(f"{cat}.db.customers").collect()) == [1001, 1002, 1003]
        after = ingest_status(instance, config.ingest[0])
        assert (after.consumer_lag, after.not_ingested, after.failed) == (0, [], [])
