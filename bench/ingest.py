"""Bench: Debezium events (default 1M: 20% creates, 70% updates, 10% deletes over 200k keys) into a
partitioned Iceberg table with our ingestion, vs pyiceberg ``Table.upsert`` (+ ``delete``) of the same
final per-batch upserts. pyiceberg runs every batch unless it passes --pyiceberg-cap-s; then its
total is extrapolated linearly from the batches it finished (said so in the output).

    .venv/bin/python bench/ingest.py [--events N] [--files F] [--pyiceberg-batches K]
"""

import argparse
import json
import os
import random
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


def generate(landing: Path, events: int, keys: int, files: int, seed: int = 7):
    """Write the landing files; return per file (upsert rows by key, deleted keys) as the batches pyiceberg gets."""
    rng = random.Random(seed)
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
                lines.append(json.dumps({"op": "c", "before": None, "after": row, "source": {"table": "t"}}))
                upserts[key] = row
                deleted.discard(key)
            elif kind == "u":
                key = live[rng.randrange(len(live))]
                row = {**state[key], "amount": round(rng.random() * 100, 2), "qty": rng.randint(1, 50),
                       "name": f"n{key}-{rng.randint(0, 9)}"}
                state[key] = row
                lines.append(json.dumps({"op": "u", "before": None, "after": row, "source": {"table": "t"}}))
                upserts[key] = row
            else:
                idx = rng.randrange(len(live))
                key = live[idx]
                live[idx] = live[-1]
                live.pop()
                row = state.pop(key)
                dead.add(key)
                lines.append(json.dumps({"op": "d", "before": row, "after": None, "source": {"table": "t"}}))
                upserts.pop(key, None)
                deleted.add(key)
        (landing / f"events-{f:04d}.json").write_text("\n".join(lines) + "\n")
        batches.append((list(upserts.values()), sorted(deleted)))
    return batches, state


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--pyiceberg-cap-s", type=float, default=300.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="icecdc-bench-ingest-"))
    os.environ.setdefault("ICECDC_CACHE_DIR", str(Path(tempfile.gettempdir()) / "icecdc-cache"))
    try:
        landing = work / "landing"
        landing.mkdir()
        t0 = time.perf_counter()
        batches, final = generate(landing, args.events, args.keys, args.files)
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
        schema = {"columns": [{"name": "id", "type": "long", "required": True}, {"name": "region", "type": "string"},
                              {"name": "name", "type": "string"}, {"name": "amount", "type": "double"},
                              {"name": "qty", "type": "long"}],
                  "partition_spec": ["region"]}
        settings = IngestSettings(landing=str(landing), target="db.ours", identifier_columns=("id",),
                                  auto_create=True, schema=schema)
        t0 = time.perf_counter()
        for f in pending_files(spark, "bench", settings):
            tb = time.perf_counter()
            result = ingest_files(spark, "bench", catalog, settings, [f])
            print(f"  ours {Path(f).name}: {time.perf_counter() - tb:.1f}s {result.targets['db.ours'].counts}")
        ours = time.perf_counter() - t0
        got = spark.table("bench.db.ours").count()
        assert got == len(final), (got, len(final))
        print(f"ours: {args.events} events in {ours:.1f}s = {args.events / ours:,.0f} events/s; "
              f"final rows {got} (matches the generator)")

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
        print(f"RESULT ours_s={ours:.1f} pyiceberg_s={theirs:.1f} ratio={ours / theirs:.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
