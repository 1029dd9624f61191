"""Bench: Debezium events (default 1M: 20% creates, 70% updates, 10% deletes over 200k keys) into a
partitioned Iceberg table with our ingestion, vs pyiceberg ``Table.upsert`` (+ ``delete``) of the same
final per-batch upserts. pyiceberg runs every batch unless it passes --pyiceberg-cap-s; then its
total is extrapolated linearly from the batches it finished (said so in the output).

Also measured in the same run:
- ``write_mode: equality_deletes``: the same files into a second target written as data files +
  equality deletes (no read of the target): ``eqdel_s`` and ``eqdel_floor_ratio`` next to ``floor_ratio``;
- floor: Spark's native JSON read of the same landing files + a plain append of the parsed rows to an
  Iceberg table (per file, as our batches are): what any Spark job pays at least;
- peak driver memory (the JVM's peak resident set + the Python driver's, after our part);
- cost against target size: one batch of --scale-events events (updates of recent keys, new keys,
  deletes: the usual CDC shape) into a --scale-small-row and a --scale-rows-row table of the same
  shape and layout (ids in order, 64 MB files, 8 MB row groups: what lets the key range skip data):
  target_scale_ratio = big / small (cost follows the batch, not the table).

``--envelope schema`` writes every line as Kafka Connect's JsonConverter does with ``schemas.enable=true``
(Debezium's default there): ``{"schema": <the envelope's Connect schema, ~1.5 KB>, "payload": {...}}``.
``--scale-rows 0`` skips the target-size part.

    PYTHONPATH=. .venv/bin/python bench/ingest.py [--events N] [--files F] [--pyiceberg-cap-s S]
                                                  [--scale-rows N] [--scale-events N] [--envelope plain|schema]
"""

import argparse
import json
import os
import random
import resource
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from pyiceberg.expressions import In

from icecdc_dagster.ingest import IngestSettings, ingest_files, pending_files
from icecdc_dagster.runtime.catalog import CatalogSettings
from icecdc_dagster.runtime.spark import SparkSettings, attach_catalog, build_spark_session

REGIONS = ["eu", "us", "ap", "sa"]
ARROW_SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("region", pa.string()),
                          pa.field("name", pa.string()), pa.field("amount", pa.float64()),
                          pa.field("qty", pa.int64())])


def _connect_value(name: str) -> dict:
    return {"type": "struct", "optional": True, "name": f"dbserver1.inventory.{name}.Value", "fields": [
        {"type": "int64", "optional": False, "field": "id"}, {"type": "string", "optional": True, "field": "region"},
        {"type": "string", "optional": True, "field": "name"}, {"type": "double", "optional": True, "field": "amount"},
        {"type": "int64", "optional": True, "field": "qty"}]}


# The envelope schema Debezium's PostgreSQL connector writes through JsonConverter (schemas.enable=true).
CONNECT_ENVELOPE = {"type": "struct", "optional": False, "name": "dbserver1.inventory.t.Envelope", "version": 1,
                    "fields": [{**_connect_value("t"), "field": "before"}, {**_connect_value("t"), "field": "after"},
                               {"type": "struct", "optional": False, "name": "io.debezium.connector.postgresql.Source",
                                "field": "source", "fields": [
                                    {"type": "string", "optional": False, "field": "version"},
                                    {"type": "string", "optional": False, "field": "connector"},
                                    {"type": "string", "optional": False, "field": "name"},
                                    {"type": "int64", "optional": False, "field": "ts_ms"},
                                    {"type": "string", "optional": True, "name": "io.debezium.data.Enum",
                                     "version": 1, "parameters": {"allowed": "true,last,false,incremental"},
                                     "default": "false", "field": "snapshot"},
                                    {"type": "string", "optional": False, "field": "db"},
                                    {"type": "string", "optional": False, "field": "schema"},
                                    {"type": "string", "optional": False, "field": "table"},
                                    {"type": "int64", "optional": True, "field": "txId"},
                                    {"type": "int64", "optional": True, "field": "lsn"}]},
                               {"type": "string", "optional": False, "field": "op"},
                               {"type": "int64", "optional": True, "field": "ts_ms"}]}


def generate(landing: Path, events: int, keys: int, files: int, seed: int = 7, envelope: str = "plain"):
    """Write the landing files; return per file (upsert rows by key, deleted keys) as the batches pyiceberg gets."""
    rng = random.Random(seed)

    def line(doc: dict) -> str:
        return json.dumps({"schema": CONNECT_ENVELOPE, "payload": doc} if envelope == "schema" else doc)
    creates = min(keys, int(events * 0.2))
    deletes = int(events * 0.1)
    kinds = ["u"] * (events - creates - deletes) + ["d"] * deletes
    rng.shuffle(kinds)
    kinds = ["c"] * creates + kinds
    live, dead = [], set()
    state: dict[int, dict] = {}
    per_file = (events + files - 1) // files
    batches = []
    for f in range(files):
        upserts: dict[int, dict] = {}
        deleted: set[int] = set()
        lines = []
        for kind in kinds[f * per_file:(f + 1) * per_file]:
            if kind == "c" or not live:
                key = len(state) + len(dead)
                row = {"id": key, "region": REGIONS[key % 4], "name": f"n{key}", "amount": 1.0, "qty": 1}
                state[key] = row
                live.append(key)
                lines.append(line({"op": "c", "before": None, "after": row, "source": {"table": "t"}}))
                upserts[key] = row
                deleted.discard(key)
            elif kind == "u":
                key = live[rng.randrange(len(live))]
                row = {**state[key], "amount": round(rng.random() * 100, 2), "qty": rng.randint(1, 50),
                       "name": f"n{key}-{rng.randint(0, 9)}"}
                state[key] = row
                lines.append(line({"op": "u", "before": None, "after": row, "source": {"table": "t"}}))
                upserts[key] = row
            else:
                idx = rng.randrange(len(live))
                key = live[idx]
                live[idx] = live[-1]
                live.pop()
                row = state.pop(key)
                dead.add(key)
                lines.append(line({"op": "d", "before": row, "after": None, "source": {"table": "t"}}))
                upserts.pop(key, None)
                deleted.add(key)
        (landing / f"events-{f:04d}.json").write_text("\n".join(lines) + "\n")
        batches.append((list(upserts.values()), sorted(deleted)))
    return batches, state


SCHEMA = {"columns": [{"name": "id", "type": "long", "required": True}, {"name": "region", "type": "string"},
                      {"name": "name", "type": "string"}, {"name": "amount", "type": "double"},
                      {"name": "qty", "type": "long"}],
          "partition_spec": ["region"]}


def jvm_peak_mb(spark) -> float:
    """The driver JVM's peak resident set (VmHWM), read from /proc."""
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def time_floor(spark, landing: Path, envelope: str = "plain") -> float:
    """Spark's own JSON reader over the landing files + a plain append of the rows, file by file."""
    spark.sql("CREATE TABLE bench.db.floor (id bigint, region string, name string, amount double, qty bigint) "
              "USING iceberg PARTITIONED BY (region) TBLPROPERTIES ('format-version'='2')")
    image = "struct<id:bigint,region:string,name:string,amount:double,qty:bigint>"
    started = time.perf_counter()
    for path in sorted(landing.iterdir()):
        events = spark.read.schema(f"op string, before {image}, after {image}").json(str(path))
        if envelope == "schema":
            events = (spark.read.schema(f"payload struct<op: string, before: {image}, after: {image}>")
                      .json(str(path)).select("payload.*"))
        (events.selectExpr("coalesce(after, before) AS r").select("r.*")
         .sortWithinPartitions("region").writeTo("bench.db.floor").append())
    return time.perf_counter() - started


def scale_batch(landing: Path, rows: int, events: int, seed: int = 11) -> None:
    """``events`` Debezium lines against a table of ids 0..rows-1: updates of the newest keys (80%), new
    keys (10%) and deletes of the newest keys (10%)."""
    rng = random.Random(seed)
    recent = range(max(rows - events, 0), rows)
    lines = []
    for n in range(events):
        kind = rng.random()
        if kind < 0.8:
            key = rng.choice(recent)
            row = {"id": key, "region": REGIONS[key % 4], "name": f"u{key}", "amount": 2.5, "qty": 2}
            lines.append({"op": "u", "before": None, "after": row})
        elif kind < 0.9:
            key = rows + n
            row = {"id": key, "region": REGIONS[key % 4], "name": f"n{key}", "amount": 1.0, "qty": 1}
            lines.append({"op": "c", "before": None, "after": row})
        else:
            key = rng.choice(recent)
            lines.append({"op": "d", "before": {"id": key, "region": REGIONS[key % 4]}, "after": None})
    landing.mkdir(parents=True, exist_ok=True)
    (landing / "batch-0001.json").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def time_scale(spark, catalog, work: Path, rows: int, events: int) -> float:
    """Seconds for one batch of ``events`` into a table of ``rows`` rows (created by Spark, ids in order)."""
    name = f"scale_{rows}"
    landing = work / f"landing_{rows}"
    scale_batch(landing, rows, events)
    settings = IngestSettings(landing=str(landing), target=f"db.{name}", identifier_columns=("id",),
                              auto_create=True, schema={**SCHEMA, "table_properties": {
                                  "format-version": "2", "write.merge.mode": "merge-on-read",
                                  "write.update.mode": "merge-on-read", "write.delete.mode": "merge-on-read",
                                  "write.target-file-size-bytes": str(64 * 1024 * 1024),
                                  "write.parquet.row-group-size-bytes": str(8 * 1024 * 1024)}})
    from icecdc_dagster.writer.auto_create import create_table, declared_columns

    create_table(spark, "bench", f"db.{name}", declared_columns(SCHEMA, name), ("id",), ["region"],
                 settings.schema["table_properties"])
    t0 = time.perf_counter()
    (spark.range(rows).selectExpr("id", "element_at(array('eu','us','ap','sa'), cast(id % 4 + 1 as int)) region",
                                  "concat('n', id) name", "1.0 amount", "1L qty")
     .sortWithinPartitions("region", "id").writeTo(f"bench.db.{name}").append())
    print(f"  target {name}: {rows:,} rows written in {time.perf_counter() - t0:.1f}s")
    (files,) = pending_files(spark, "bench", settings)
    t0 = time.perf_counter()
    result = ingest_files(spark, "bench", catalog, settings, [files])
    took = time.perf_counter() - t0
    print(f"  {events:,} events into {rows:,} rows: {took:.1f}s {result.targets[f'db.{name}'].counts}")
    return took


def time_ingest(spark, catalog, landing: Path, target: str, write_mode: str, expected_rows: int,
                keys: tuple[str, ...] = ("id",)) -> float:
    """Seconds for our ingestion of every landing file into ``target`` (one batch per file) with
    ``write_mode``; the final row count must match the generator's."""
    settings = IngestSettings(landing=str(landing), target=target, identifier_columns=keys,
                              auto_create=True, schema=SCHEMA, write_mode=write_mode)
    t0 = time.perf_counter()
    for f in pending_files(spark, "bench", settings):
        tb = time.perf_counter()
        result = ingest_files(spark, "bench", catalog, settings, [f])
        print(f"  {write_mode} {Path(f).name}: {time.perf_counter() - tb:.1f}s {result.targets[target].counts}")
    took = time.perf_counter() - t0
    got = spark.table(f"bench.{target}").count()
    assert got == expected_rows, (got, expected_rows)
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--pyiceberg-cap-s", type=float, default=300.0)
    parser.add_argument("--scale-events", type=int, default=10_000)
    parser.add_argument("--scale-small-rows", type=int, default=1_000_000)
    parser.add_argument("--scale-rows", type=int, default=100_000_000)
    parser.add_argument("--envelope", choices=("plain", "schema"), default="plain")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="icecdc-bench-ingest-"))
    os.environ.setdefault("ICECDC_CACHE_DIR", str(Path(tempfile.gettempdir()) / "icecdc-cache"))
    try:
        landing = work / "landing"
        landing.mkdir()
        t0 = time.perf_counter()
        batches, final = generate(landing, args.events, args.keys, args.files, envelope=args.envelope)
        print(f"generated {args.events} events in {args.files} files over {args.keys} keys "
              f"({sum(f.stat().st_size for f in landing.iterdir()) / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f}s")
        cs = CatalogSettings(name="bench", uri=f"sqlite:///{work}/catalog.db", warehouse=f"file://{work}/warehouse")
        spark = build_spark_session(SparkSettings(master="local[2]", app_name="bench-ingest",
                                                  conf={"spark.ui.enabled": "false", "spark.driver.memory": "4g",
                                                        "spark.sql.shuffle.partitions": "8"},
                                                  jdbc_drivers=("sqlite",)))
        catalog = cs.load_pyiceberg()
        attach_catalog(spark, cs)
        catalog.create_namespace("db")
        ours = time_ingest(spark, catalog, landing, "db.ours", "merge", len(final))
        driver_mb = jvm_peak_mb(spark) + resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"ours: {args.events} events in {ours:.1f}s = {args.events / ours:,.0f} events/s; "
              f"final rows {len(final)} (matches the generator); peak driver memory {driver_mb:,.0f} MB (JVM + Python)")

        # equality deletes reach only their own partition: the partition column joins the key (a key's
        # region never changes here, so (id, region) identifies the same rows as id)
        eqdel = time_ingest(spark, catalog, landing, "db.ours_eqdel", "equality_deletes", len(final), ("id", "region"))
        print(f"write_mode equality_deletes: {args.events} events in {eqdel:.1f}s = {args.events / eqdel:,.0f} "
              f"events/s (merge: {ours:.1f}s)")

        floor = time_floor(spark, landing, args.envelope)
        print(f"floor (Spark JSON read + plain append, per file): {floor:.1f}s; ours / floor = {ours / floor:.2f}; "
              f"equality_deletes / floor = {eqdel / floor:.2f}")

        small = big = float("nan")
        if args.scale_rows:
            small = time_scale(spark, catalog, work, args.scale_small_rows, args.scale_events)
            big = time_scale(spark, catalog, work, args.scale_rows, args.scale_events)
        print(f"one batch of {args.scale_events:,} events: {small:.1f}s into {args.scale_small_rows:,} rows, "
              f"{big:.1f}s into {args.scale_rows:,} rows")

        table = catalog.create_table("db.theirs", schema=ARROW_SCHEMA, properties={"format-version": "2"})
        with table.update_spec() as update:
            update.add_identity("region")
        t0 = time.perf_counter()
        k = 0
        for i, (upserts, deleted) in enumerate(batches):
            if time.perf_counter() - t0 > args.pyiceberg_cap_s:
                break
            k += 1
            tb = time.perf_counter()
            if deleted:
                table.delete(In("id", deleted))
            table.upsert(pa.Table.from_pylist(upserts, schema=ARROW_SCHEMA), join_cols=["id"])
            print(f"  pyiceberg batch {i}: {len(upserts)} upserts, {len(deleted)} deletes, "
                  f"{time.perf_counter() - tb:.1f}s")
        measured = time.perf_counter() - t0
        theirs = measured * len(batches) / k
        if k < len(batches):
            print(f"pyiceberg: {k} of {len(batches)} batches in {measured:.1f}s; EXTRAPOLATED linearly to all "
                  f"batches: {theirs:.1f}s")
        else:
            print(f"pyiceberg: all {k} batches in {measured:.1f}s (measured, not extrapolated)")
            got = len(table.scan().to_arrow())
            assert got == len(final), (got, len(final))
        spark.stop()
        print(f"RESULT ours_s={ours:.1f} pyiceberg_s={theirs:.1f} ratio={ours / theirs:.3f} floor_s={floor:.1f} "
              f"floor_ratio={ours / floor:.2f} events_per_s={args.events / ours:.0f} driver_peak_mb={driver_mb:.0f} "
              f"target_scale_ratio={big / small:.2f} scale_small_s={small:.1f} scale_big_s={big:.1f} "
              f"eqdel_s={eqdel:.1f} eqdel_floor_ratio={eqdel / floor:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
