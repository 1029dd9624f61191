"""The demo table and the snapshots we commit to it (inserts, CoW updates, MoR deletes, MERGE, compaction),
and a Debezium stream of customers landed as files (the OLTP side of the chain)."""

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SOURCE_TABLE = "demo.orders"
REPLICA_TABLE = "demo_replica.orders"


def create_source(spark: "SparkSession", catalog: str) -> None:
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog}.demo")
    spark.sql(f"""
        CREATE TABLE IF NOT EXISTS {catalog}.{SOURCE_TABLE} (
            order_id BIGINT NOT NULL, customer STRING, amount DECIMAL(12, 2), status STRING, updated_at TIMESTAMP)
        USING iceberg PARTITIONED BY (bucket(4, order_id))
        TBLPROPERTIES ('format-version'='2', 'write.update.mode'='copy-on-write',
                       'write.delete.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')""")
    spark.sql(f"ALTER TABLE {catalog}.{SOURCE_TABLE} SET IDENTIFIER FIELDS order_id")


def initial_load(spark: "SparkSession", catalog: str) -> None:
    spark.sql(f"""INSERT INTO {catalog}.{SOURCE_TABLE}
        SELECT id, concat('customer-', id % 37), CAST(id * 1.25 AS DECIMAL(12, 2)), 'NEW',
               TIMESTAMP '2026-01-01 00:00:00' + make_interval(0, 0, 0, 0, 0, 0, id)
        FROM range(1, 1001)""")


CHANGES = (
    ("copy-on-write UPDATE of 50 orders",
     "UPDATE {t} SET status = 'SHIPPED', updated_at = TIMESTAMP '2026-02-01 00:00:00' WHERE order_id % 20 = 0"),
    ("merge-on-read DELETE of 20 orders", "DELETE FROM {t} WHERE order_id % 50 = 7"),
    ("INSERT of 100 new orders",
     "INSERT INTO {t} SELECT id, concat('customer-', id % 37), CAST(id * 2 AS DECIMAL(12, 2)), 'NEW', "
     "TIMESTAMP '2026-03-01 00:00:00' FROM range(1001, 1101)"),
    ("merge-on-read MERGE: 20 updated, 20 inserted",
     "MERGE INTO {t} t USING (SELECT id AS order_id FROM range(1081, 1121)) s ON t.order_id = s.order_id "
     "WHEN MATCHED THEN UPDATE SET t.status = 'PAID' "
     "WHEN NOT MATCHED THEN INSERT (order_id, customer, amount, status, updated_at) "
     "VALUES (s.order_id, 'walk-in', CAST(9.99 AS DECIMAL(12, 2)), 'PAID', TIMESTAMP '2026-04-01 00:00:00')"),
    ("compaction (REPLACE: no logical change)",
     "CALL {c}.system.rewrite_data_files(table => '{c}.{n}', options => map('rewrite-all','true'))"),
)


def apply_changes(spark: "SparkSession", catalog: str) -> list[str]:
    done = []
    for description, statement in CHANGES:
        spark.sql(statement.format(t=f"{catalog}.{SOURCE_TABLE}", c=catalog, n=SOURCE_TABLE))
        done.append(description)
    return done


CUSTOMERS_TABLE = "demo_raw.customers"


def _envelope(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, ts_ms: int) -> str:
    return json.dumps({"payload": {"op": op, "before": before, "after": after, "ts_ms": ts_ms,
                                   "source": {"connector": "postgresql", "schema": "public", "table": "customers"}}})


def customer_stream() -> tuple[list[str], list[str]]:
    """A Debezium connector's events for the customers table: a snapshot (``op: r``) of 50 customers, then a
    stream with updates, deletes, a new column, a tombstone and one bad line."""
    snapshot = [_envelope("r", None, {"id": i, "name": f"customer-{i}", "tier": "basic"}, 1000 + i)
                for i in range(50)]
    stream = [_envelope("u", {"id": i, "name": f"customer-{i}", "tier": "basic"},
                        {"id": i, "name": f"customer-{i}", "tier": "gold", "email": f"c{i}@example.com"}, 2000 + i)
              for i in range(0, 50, 5)]
    stream += [_envelope("d", {"id": i, "name": f"customer-{i}", "tier": "basic"}, None, 3000 + i)
               for i in range(1, 50, 10)]
    stream += ["null", '{"payload": {"op": "u", "after": {"id": "not-a-number"}}}']
    return snapshot, stream


def publish_customer_stream(url: str, stream_name: str, subject: str) -> int:
    """The same events on a JetStream subject, as Debezium Server's nats-jetstream sink writes them (once: a
    stream that exists already keeps what it has). Returns the messages published."""
    import asyncio  # asyncio: ~0.4 s; only the NATS publisher runs a loop

    import nats  # optional in use: only the NATS demo publishes
    from nats.js.errors import NotFoundError  # optional in use: only the NATS demo publishes

    async def publish() -> int:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            try:
                await js.stream_info(stream_name)
                return 0
            except NotFoundError:
                await js.add_stream(name=stream_name, subjects=[subject])
            snapshot, stream = customer_stream()
            for line in snapshot + stream:
                await js.publish(subject, b"" if line == "null" else line.encode())
            return len(snapshot) + len(stream)
        finally:
            await nc.close()

    return asyncio.run(publish())


def land_customer_stream(landing: Path) -> list[str]:
    """Two landing files as a Debezium connector would write them: the snapshot, then the stream."""
    landing.mkdir(parents=True, exist_ok=True)
    snapshot, stream = customer_stream()
    names = []
    for name, lines in (("0001-snapshot.json", snapshot), ("0002-stream.json", stream)):
        path = landing / name
        if not path.exists():
            path.write_text("\n".join(lines) + "\n")
        names.append(name)
    return names
