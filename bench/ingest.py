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

- handwritten: what a competent engineer writes by hand for the same files into an identical fresh target
  (created up front, outside the timing), one batch per file: Spark's JSON reader, the last image per key
  by source position (``row_number`` over the key ordered by ``monotonically_increasing_id()`` desc: the
  reader keeps a file's line order), one ``MERGE INTO`` with delete / update / insert clauses. No exact
  counts, no dead letters, no exactly-once ledger. Its final table is checked equal to ours
  (``handwritten_ratio`` = ours / handwritten);
- where our time goes: each batch's wall time split by phase (exclusive time of the engine's public
  write-side functions, :class:`Phases`) and Spark's own job records per call site (``--cprofile PATH``
  also writes a cProfile of the driver);
- read floors, after ours and the handwritten job, CPU-s of driver + JVM into Spark's ``noop`` sink (best of 2):
  the handwritten job's JSON read (``read_json_cpu_s``) and the least read the Spark-expression typing needs: line
  text, line order, ``from_json`` to maps of field texts (``read_rules_floor_cpu_s``; plain lines are typed by
  ``native/LineTyper.java`` now, which needs no maps: below this floor); against them our read phase
  (``read_ratio``, ``rules_floor_ratio``), and our MERGE against the handwritten one (its CPU-s less its read:
  ``merge_ratio``);
- our read split, into ``noop`` the same way (best of 2): the native typing a batch computes
  (``ingester.native_read``, as a batch plans it: ``read_typed_cpu_s``, ``typing_ratio`` against the rules
  floor), the same with the batch's figures as it has them, tallied or observed (``read_typed_observed_cpu_s``),
  and DERIVED, our read phase less that: the checkpoint and the rest of the phase's driver work
  (``read_checkpoint_derived_cpu_s``).

``--warm`` runs our ingestion (both write modes) and the handwritten job once each (into other tables, untimed)
before the timed runs: a daemon's JVM is warm (JIT, generated code, classes); without it ours runs first, on a cold
JVM.

``--rounds N`` repeats the timed part N times (ours in both write modes, the floor, the handwritten job, each into
fresh tables, in that order) and prints each round; the RESULT line then holds each time's and CPU time's median
over the rounds, and the ratios of those medians. One round on this warm 2-core machine varies by about +-20 %
from the next (and the JIT keeps speeding every side up for several rounds), so a single round can pass or fail
a 1.5 goal by chance.

``--envelope schema`` writes every line as Kafka Connect's JsonConverter does with ``schemas.enable=true``
(Debezium's default there): ``{"schema": <the envelope's Connect schema, ~1.5 KB>, "payload": {...}}``.
``--scale-rows 0`` skips the target-size part. The session has the product's Spark settings (a local master's
shuffle partitions: one per core); ``ICECDC_BENCH_SPARK_CONF`` (JSON) adds or replaces settings, e.g.
``'{"spark.sql.shuffle.partitions": "8"}'``.

    PYTHONPATH=. .venv/bin/python bench/ingest.py [--events N] [--files F] [--pyiceberg-cap-s S]
                                                  [--scale-rows N] [--scale-events N] [--envelope plain|schema]
                                                  [--cprofile PATH] [--warm [--warm-rounds N]] [--rounds N]
"""

import argparse
import cProfile
import functools
import json
import os
import pstats
import random
import resource
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
from proc_cpu import cpu_s
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


def time_floor(spark, landing: Path, envelope: str = "plain", table: str = "bench.db.floor") -> float:  # noqa: ANN001
    """Spark's own JSON reader over the landing files + a plain append of the rows, file by file."""
    spark.sql(f"CREATE TABLE {table} (id bigint, region string, name string, amount double, qty bigint) "
              "USING iceberg PARTITIONED BY (region) TBLPROPERTIES ('format-version'='2')")
    image = "struct<id:bigint,region:string,name:string,amount:double,qty:bigint>"
    started = time.perf_counter()
    for path in sorted(landing.iterdir()):
        events = spark.read.schema(f"op string, before {image}, after {image}").json(str(path))
        if envelope == "schema":
            events = (spark.read.schema(f"payload struct<op: string, before: {image}, after: {image}>")
                      .json(str(path)).select("payload.*"))
        (events.selectExpr("coalesce(after, before) AS r").select("r.*")
         .sortWithinPartitions("region").writeTo(table).append())
    return time.perf_counter() - started


def events_frame(spark, path: Path, envelope: str = "plain"):  # noqa: ANN001, ANN201 - DataFrame
    """A landing file through Spark's JSON reader: op, before, after (the schema envelope's payload too)."""
    image = "struct<id:bigint,region:string,name:string,amount:double,qty:bigint>"
    if envelope == "schema":
        return (spark.read.schema(f"payload struct<op: string, before: {image}, after: {image}>")
                .json(str(path)).select("payload.*"))
    return spark.read.schema(f"op string, before {image}, after {image}").json(str(path))


def create_like_ours(spark, name: str) -> None:  # noqa: ANN001
    """A fresh table made exactly as our auto-create makes the bench's target (same DDL and properties)."""
    from icecdc_dagster.writer.auto_create import create_table, declared_columns

    create_table(spark, "bench", name, declared_columns(SCHEMA, name), ("id",), SCHEMA["partition_spec"])


def handwritten_batch(spark, path: Path, table: str, envelope: str = "plain") -> tuple[float, float]:  # noqa: ANN001
    """One landing file the way a user writes it by hand: JSON reader -> last image per key by source
    position -> one MERGE INTO with delete / update / insert clauses. Returns (prepare_s, merge_s):
    the last-image aggregate that the MERGE's source needs is planned lazily, so prepare is ~0."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    t0 = time.perf_counter()
    events = events_frame(spark, path, envelope).withColumn("pos", F.monotonically_increasing_id())
    latest = (events.select("op", "pos", F.coalesce("after", "before").alias("r")).select("op", "pos", "r.*")
              .withColumn("rn", F.row_number().over(Window.partitionBy("id").orderBy(F.col("pos").desc())))
              .where("rn = 1").drop("rn", "pos"))
    latest.createOrReplaceTempView("handwritten_batch")
    t1 = time.perf_counter()
    spark.sql(f"MERGE INTO {table} t USING handwritten_batch s ON t.id = s.id "
              "WHEN MATCHED AND s.op = 'd' THEN DELETE "
              "WHEN MATCHED THEN UPDATE SET * "
              "WHEN NOT MATCHED AND s.op != 'd' THEN INSERT *")
    return t1 - t0, time.perf_counter() - t1


def time_handwritten(spark, landing: Path, envelope: str = "plain", table: str = "db.hand"  # noqa: ANN001
                     ) -> tuple[float, float]:
    """The handwritten job over every landing file (one MERGE per file, as our batches), into ``table`` (a fresh
    one): (seconds, CPU seconds of driver + JVM)."""
    create_like_ours(spark, table)
    cpu = work_cpu(spark)
    started, c0 = time.perf_counter(), cpu()
    for path in sorted(landing.iterdir()):
        tb = time.perf_counter()
        handwritten_batch(spark, path, f"bench.{table}", envelope)
        print(f"  handwritten {path.name}: {time.perf_counter() - tb:.1f}s", flush=True)
    return time.perf_counter() - started, cpu() - c0


def same_rows(spark, left: str, right: str) -> bool:  # noqa: ANN001
    """Whether two tables hold the same multiset of rows (both differences empty)."""
    a, b = spark.table(left), spark.table(right).select(*spark.table(left).columns)
    return a.exceptAll(b).isEmpty() and b.exceptAll(a).isEmpty()


class Phases:
    """Wall time of one batch split by phase: each public engine function listed in ``PATCHED`` is wrapped,
    and a phase's time excludes the wrapped phases it calls (so the phases add up to the wrapped total).
    The patches are module attributes, undone by :meth:`restore`; they cost a timer call per phase."""

    # (module, attribute, phase): functions looked up through these module attributes at call time
    PATCHED = (("icecdc_dagster.ingest.ingester", "read_ledger", "ledger read (is the batch committed?)"),
               ("icecdc_dagster.ingest.commit", "write_batch", "write: plan (the collapse runs in the MERGE)"),
               ("icecdc_dagster.writer.merge", "is_committed", "write: ledger check"),
               ("icecdc_dagster.writer.merge", "staged_commit", "write: staging branch, refreshes"),
               ("icecdc_dagster.writer.merge", "merged_counts", "write: exact counts (observed in the MERGE)"),
               ("icecdc_dagster.writer.exactly_once", "publish", "write: publish (fast-forward + ledger)"),
               ("icecdc_dagster.ingest.dead_letters", "ensure_table", "dead-letter table"))
    MERGE = "write: MERGE INTO (Spark)"
    READ = "read + classify + checks (ingest_files itself)"

    def __init__(self, sc: Any = None, cpu: Callable[[], float] | None = None) -> None:
        self.sc = sc  # SparkContext: each phase names its Spark jobs (their description) when given
        self.cpu = cpu or (lambda: 0.0)  # CPU seconds so far of the processes that do the work
        self.totals: dict[str, float] = {}
        self.cpu_totals: dict[str, float] = {}
        self.ours_cpu = 0.0  # CPU seconds of the whole timed run (set by run_ours)
        self.stack: list[list[float]] = []  # per open phase: [child seconds, child CPU seconds]
        self.saved: list[tuple[Any, str, Any]] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.stack.append([0.0, 0.0])
        prior = self.sc.getLocalProperty("spark.job.description") if self.sc else None
        if self.sc:
            self.sc.setLocalProperty("spark.job.description", name)
        t0, c0 = time.perf_counter(), self.cpu()
        try:
            yield
        finally:
            took, spent = time.perf_counter() - t0, self.cpu() - c0
            if self.sc:
                self.sc.setLocalProperty("spark.job.description", prior)
            children, children_cpu = self.stack.pop()
            self.totals[name] = self.totals.get(name, 0.0) + took - children
            self.cpu_totals[name] = self.cpu_totals.get(name, 0.0) + spent - children_cpu
            if self.stack:
                self.stack[-1][0] += took
                self.stack[-1][1] += spent

    def wrap(self, name: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name):
                return fn(*args, **kwargs)
        return timed

    def install(self) -> None:
        import importlib

        for module_name, attr, name in self.PATCHED:
            module = importlib.import_module(module_name)
            original = getattr(module, attr)
            self.saved.append((module, attr, original))
            setattr(module, attr, self.wrap(name, self.timing_write(original) if attr == "staged_commit"
                                            else original))

    def timing_write(self, staged_commit: Callable) -> Callable:
        """``staged_commit`` whose ``write`` callback (the MERGE itself) is its own phase."""
        def run(spark: Any, table: str, properties: dict, write: Callable, *args: Any, **kwargs: Any) -> Any:
            return staged_commit(spark, table, properties, self.wrap(self.MERGE, write), *args, **kwargs)
        return run

    def restore(self) -> None:
        for module, attr, original in reversed(self.saved):
            setattr(module, attr, original)
        self.saved.clear()

    def report(self, total: float, total_cpu: float) -> str:
        lines = [f"    {name:<48s} {s:7.1f}s {100 * s / total:5.1f} %  {self.cpu_totals[name]:6.2f} CPU-s"
                 for name, s in sorted(self.totals.items(), key=lambda kv: -kv[1])]
        rest, rest_cpu = total - sum(self.totals.values()), total_cpu - sum(self.cpu_totals.values())
        lines.append(f"    {'(bench loop: between calls)':<48s} {rest:7.1f}s {100 * rest / total:5.1f} %  "
                     f"{rest_cpu:6.2f} CPU-s")
        return "\n".join(lines)


def work_cpu(spark) -> Callable[[], float]:  # noqa: ANN001
    """CPU seconds so far of this process (the driver) and its JVM (which runs the executors in local mode;
    the native path starts no Python worker)."""
    jvm = int(spark._jvm.java.lang.ProcessHandle.current().pid())  # noqa: SLF001
    return lambda: time.process_time() + cpu_s(jvm)


def to_noop(frame: Any) -> None:
    """Compute every row and column of ``frame`` into Spark's ``noop`` sink: it writes nothing, so what is left
    is the read."""
    frame.write.format("noop").mode("overwrite").save()


def best_cpu(spark, run: Callable[[Path], Any], landing: Path, repeats: int = 2) -> float:  # noqa: ANN001
    """CPU-s of driver + JVM for ``run(path)`` over every landing file, best of ``repeats``: the best of a few
    drops a pass that still compiled (JIT, generated code)."""
    cpu = work_cpu(spark)
    best = float("inf")
    for _ in range(repeats):
        c0 = cpu()
        for path in sorted(landing.iterdir()):
            run(path)
        best = min(best, cpu() - c0)
    return best


def noop_cpu(spark, frame: Callable[[Path], Any], landing: Path, repeats: int = 2) -> float:  # noqa: ANN001
    """CPU-s of driver + JVM to materialise ``frame(path)`` of every landing file into Spark's ``noop`` sink, best
    of ``repeats`` (:func:`best_cpu`)."""
    return best_cpu(spark, lambda path: to_noop(frame(path)), landing, repeats)


def rules_envelope(envelope: str) -> Any:
    """The envelope our native typing parses every line to (``line_typing``: op, and each image a map of its
    fields' texts, which is what lets it prove a value exact); the schema envelope's payload holds them."""
    from pyspark.sql import types as T

    text_map = T.MapType(T.StringType(), T.StringType())
    payload = T.StructType([T.StructField("op", T.StringType()), T.StructField("before", text_map),
                            T.StructField("after", text_map)])
    return T.StructType([T.StructField("payload", payload)]) if envelope == "schema" else payload


def rules_floor_frame(spark, path: Path, envelope: str = "plain") -> Any:  # noqa: ANN001
    """The least a reader that keeps our rules reads of one file: each line's text (kept: a dead letter carries
    it), its position in the file (``landing_lines.lines``: the last image per key needs the order) and one
    ``from_json`` of the line to :func:`rules_envelope`; no typing, no checks."""
    from pyspark.sql import functions as F

    from icecdc_dagster.ingest.landing import LandingFile
    from icecdc_dagster.ingest.landing_lines import lines
    from icecdc_dagster.ingest.native.line_typing import JSON_OPTIONS

    read = lines(spark, [LandingFile(uri=str(path), size=path.stat().st_size)])
    return read.select("source_offset", "raw",
                       F.from_json("raw", rules_envelope(envelope), JSON_OPTIONS).alias("envelope"))


def typed_in_write(jobs: dict) -> bool:
    """Whether our batches were typed inside their writes (no checkpoint job of the read: the typing's CPU is in
    the MERGE's phase, as the handwritten job's JSON read is in its MERGE)."""
    return not any("localCheckpoint" in site for site in jobs)


def read_floors(spark, landing: Path, envelope: str, phases: Phases,  # noqa: ANN001
                handwritten_cpu: float, settings: IngestSettings, in_write: bool) -> dict[str, float]:
    """Where our ingest cost sits against the handwritten job's, read against reading floors on the same warm
    session: the handwritten job's JSON read, the least read our rules need, and each side's MERGE (the
    handwritten one derived: its total less its read). Where our batches were typed inside their MERGE
    (``in_write``), our read is the read phase's driver work plus the typing into ``noop`` and our MERGE its
    phase less that typing (both DERIVED), so each side is compared with the same split. Prints a line per
    probe; returns the RESULT keys."""
    read_json = noop_cpu(spark, lambda path: events_frame(spark, path, envelope), landing)
    floor = noop_cpu(spark, lambda path: rules_floor_frame(spark, path, envelope), landing)
    ours_read = phases.cpu_totals.get(Phases.READ, float("nan"))
    ours_merge = phases.cpu_totals.get(Phases.MERGE, float("nan"))
    how = f"ours ({Phases.READ})"
    if in_write:
        typed = noop_cpu(spark, lambda path: typed_read(spark, settings, path).frame, landing)
        ours_read, ours_merge = ours_read + typed, ours_merge - typed
        how = f"ours (DERIVED: {Phases.READ} + the typing into noop, {typed:.2f}; the batch typed it in its MERGE)"
    hand_merge = handwritten_cpu - read_json
    print(f"read: Spark's JSON reader, the handwritten job's schema -> noop: {read_json:.2f} CPU-s (best of 2); "
          f"{how} {ours_read:.2f}: read_ratio {ours_read / read_json:.2f}")
    print(f"read floor of our rules: text reader + line order + from_json to maps of field texts -> noop: "
          f"{floor:.2f} CPU-s (best of 2): rules_floor_ratio {ours_read / floor:.2f}")
    print(f"merge: ours ({Phases.MERGE}{' less the typing, DERIVED' if in_write else ''}) {ours_merge:.2f} CPU-s; "
          f"handwritten {hand_merge:.2f} (DERIVED: its {handwritten_cpu:.2f} CPU-s less the JSON read): merge_ratio "
          f"{ours_merge / hand_merge:.2f}", flush=True)
    return {"read_json_cpu_s": read_json, "read_rules_floor_cpu_s": floor, "ours_read_cpu_s": ours_read,
            "ours_merge_cpu_s": ours_merge, "handwritten_merge_cpu_s": hand_merge,
            "read_ratio": ours_read / read_json, "rules_floor_ratio": ours_read / floor,
            "merge_ratio": ours_merge / hand_merge}


def typed_read(spark, settings: IngestSettings, path: Path) -> Any:  # noqa: ANN001 - ingester.NativeRead
    """The native typing a batch of this one file computes (``ingester.native_read``: the frame its checkpoint
    materialises, and the figures it observes), planned as ``ingest_files`` plans it: the file described, its
    schema blocks sampled, its lines from the text reader. The driver's planning is part of what it costs."""
    from icecdc_dagster.ingest import landing, landing_lines, native
    from icecdc_dagster.ingest.ingester import native_read

    described = landing.describe([str(path)])
    return native_read(spark, "bench", settings, landing_lines.lines(spark, described),
                       native.sample_branches(described))


def observed_to_noop(spark, settings: IngestSettings, path: Path) -> None:  # noqa: ANN001
    """:func:`typed_read` into ``noop`` with the batch's figures as the batch has them, no checkpoint: tallied by
    the JVM typer, else observed (their values waited for as the batch waits for them, ``observation_values``)."""
    from pyspark.sql import Observation

    from icecdc_dagster.writer import observation_values

    read = typed_read(spark, settings, path)
    figures = read.figures()
    if not figures:  # the typer tallies them as it makes the rows
        to_noop(read.frame)
        assert read.tally is not None and read.tally.figures()["events_read"], "the typer tallied no line"
        return
    observed = Observation(f"bench_lines_{time.perf_counter_ns()}")
    to_noop(read.frame.observe(observed, *figures))
    assert observation_values(observed, timeout_s=30) is not None, "the figures did not arrive with the write"


def read_split(spark, landing: Path, settings: IngestSettings, floors: dict[str, float]) -> dict[str, float]:  # noqa: ANN001
    """Where our read phase goes above the rules floor (issue #45), on the same files and warm session: the
    native typing alone, the typing + the batch's figures, and (derived) the checkpoint with the rest of the
    phase's driver work (no checkpoint where the batch was typed in its write: the read phase's driver work
    and the probes' spread). Prints a line per probe; returns the RESULT keys."""
    typed = noop_cpu(spark, lambda path: typed_read(spark, settings, path).frame, landing)
    observed = best_cpu(spark, lambda path: observed_to_noop(spark, settings, path), landing)
    ours_read, floor = floors["ours_read_cpu_s"], floors["read_rules_floor_cpu_s"]
    print(f"read split: our native typing (ingester.native_read, as a batch plans it) -> noop: {typed:.2f} CPU-s "
          f"(best of 2): typing_ratio {typed / floor:.2f} against the rules floor {floor:.2f}")
    print(f"read split: the same + the batch's figures (tallied, else observed) -> noop: {observed:.2f} CPU-s "
          f"(best of 2): the "
          f"figures {observed - typed:.2f} (DERIVED)")
    print(f"read split: the checkpoint and the rest of our read phase's driver work: {ours_read - observed:.2f} "
          f"CPU-s (DERIVED: ours {ours_read:.2f} less typing + figures; ours is one pass, the probes best of 2)",
          flush=True)
    return {"read_typed_cpu_s": typed, "read_typed_observed_cpu_s": observed,
            "read_checkpoint_derived_cpu_s": ours_read - observed, "typing_ratio": typed / floor}


def spark_jobs(spark, group: str) -> dict[str, tuple[int, float]]:  # noqa: ANN001
    """Spark's own records of a job group's jobs: (phase, action) -> (jobs, seconds submitted -> done)."""
    sc = spark.sparkContext
    store = sc._jsc.sc().statusStore()  # noqa: SLF001 - Spark's job records (kept with the UI off too)
    out: dict[str, tuple[int, float]] = {}
    for job_id in sc.statusTracker().getJobIdsForGroup(group):
        data = store.job(job_id)
        submitted, completed = data.submissionTime(), data.completionTime()
        if submitted.isEmpty() or completed.isEmpty():
            continue
        seconds = (completed.get().getTime() - submitted.get().getTime()) / 1000
        description = str(data.description().get()) if data.description().isDefined() else "?"
        site = f"{description} | {str(data.name()).split(' at ')[0]}"
        jobs, total = out.get(site, (0, 0.0))
        out[site] = (jobs + 1, total + seconds)
    return out


def run_ours(spark, catalog, settings, cprofile: str = "") -> tuple[float, Phases, dict]:  # noqa: ANN001
    """Our ingestion of every pending file (one batch each), timed, split by phase and by Spark job."""
    phases = Phases(spark.sparkContext, work_cpu(spark))
    phases.install()
    profiler = cProfile.Profile() if cprofile else None
    jobs: dict[str, tuple[int, float]] = {}
    t0, c0 = time.perf_counter(), phases.cpu()
    try:
        for i, f in enumerate(pending_files(spark, "bench", settings)):
            tb = time.perf_counter()
            spark.sparkContext.setJobGroup(f"ours-{i}", f"ours {Path(f).name}")
            if profiler:
                profiler.enable()
            with phases.phase(Phases.READ):
                result = ingest_files(spark, "bench", catalog, settings, [f])
            if profiler:
                profiler.disable()
            for site, (n, seconds) in spark_jobs(spark, f"ours-{i}").items():
                prior = jobs.get(site, (0, 0.0))
                jobs[site] = (prior[0] + n, prior[1] + seconds)
            print(f"  ours {Path(f).name}: {time.perf_counter() - tb:.1f}s {result.targets['db.ours'].counts}",
                  flush=True)
        ours = time.perf_counter() - t0
        phases.ours_cpu = phases.cpu() - c0
    finally:
        phases.restore()
        spark.sparkContext.setJobGroup("bench", "bench")
    if profiler:
        profiler.dump_stats(cprofile)
        stats = pstats.Stats(profiler)
        print(f"cProfile of our driver (wall, cumulative; whole file in {cprofile}):")
        stats.sort_stats("cumulative").print_stats(r"icecdc_dagster", 25)
    return ours, phases, jobs


def print_split(ours: float, phases: Phases, jobs: dict) -> None:
    print(f"where our {ours:.1f}s ({phases.ours_cpu:.1f} CPU-s of driver + JVM) go (driver wall, phases exclusive):")
    print(phases.report(ours, phases.ours_cpu))
    print("Spark jobs by call site (jobs, seconds submitted -> done; jobs of one phase can overlap):")
    for site, (n, seconds) in sorted(jobs.items(), key=lambda kv: -kv[1][1]):
        print(f"    {seconds:7.1f}s {n:4d} jobs  {site[:110]}")


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
    return time_ingest_cpu(spark, catalog, landing, target, write_mode, expected_rows, keys)[0]


def time_ingest_cpu(spark, catalog, landing: Path, target: str, write_mode: str, expected_rows: int,  # noqa: ANN001
                    keys: tuple[str, ...] = ("id",)) -> tuple[float, float]:
    """:func:`time_ingest` with the CPU seconds of driver + JVM it took: (seconds, CPU seconds)."""
    cpu = work_cpu(spark)
    c0 = cpu()
    settings = IngestSettings(landing=str(landing), target=target, identifier_columns=keys,
                              auto_create=True, schema=SCHEMA, write_mode=write_mode)
    t0 = time.perf_counter()
    for f in pending_files(spark, "bench", settings):
        tb = time.perf_counter()
        result = ingest_files(spark, "bench", catalog, settings, [f])
        print(f"  {write_mode} {Path(f).name}: {time.perf_counter() - tb:.1f}s {result.targets[target].counts}")
    took, spent = time.perf_counter() - t0, cpu() - c0
    got = spark.table(f"bench.{target}").count()
    assert got == expected_rows, (got, expected_rows)
    return took, spent


def median(values: list[float]) -> float:
    """The middle value (the mean of the two middle ones for an even count)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def timed_round(spark, catalog, landing: Path, envelope: str, expected_rows: int, k: int) -> dict[str, float]:  # noqa: ANN001
    """One more timed round of the four (into fresh tables, in the first round's order: ours, equality deletes,
    the floor, the handwritten job): seconds and CPU seconds of driver + JVM."""
    ours, ours_cpu = time_ingest_cpu(spark, catalog, landing, f"db.ours_r{k}", "merge", expected_rows)
    eqdel = time_ingest(spark, catalog, landing, f"db.ours_eqdel_r{k}", "equality_deletes", expected_rows,
                        ("id", "region"))
    floor = time_floor(spark, landing, envelope, f"bench.db.floor_r{k}")
    handwritten, handwritten_cpu = time_handwritten(spark, landing, envelope, f"db.hand_r{k}")
    return {"ours": ours, "ours_cpu": ours_cpu, "eqdel": eqdel, "floor": floor, "handwritten": handwritten,
            "handwritten_cpu": handwritten_cpu}


def print_round(k: int, r: dict[str, float]) -> None:
    print(f"round {k}: ours {r['ours']:.2f}s ({r['ours_cpu']:.2f} CPU-s), handwritten {r['handwritten']:.2f}s "
          f"({r['handwritten_cpu']:.2f} CPU-s): handwritten_ratio {r['ours'] / r['handwritten']:.2f}, "
          f"handwritten_cpu_ratio {r['ours_cpu'] / r['handwritten_cpu']:.2f}; equality_deletes {r['eqdel']:.2f}s, "
          f"floor {r['floor']:.2f}s: eqdel_floor_ratio {r['eqdel'] / r['floor']:.2f}", flush=True)


def time_pyiceberg(catalog, name: str, batches, cap_s: float) -> tuple[float, int]:  # noqa: ANN001
    """pyiceberg's ``delete`` + ``upsert`` of each batch's final images into a fresh table like ours: (seconds,
    batches done); it stops starting batches after ``cap_s``."""
    table = catalog.create_table(name, schema=ARROW_SCHEMA, properties={"format-version": "2"})
    with table.update_spec() as update:
        update.add_identity("region")
    t0 = time.perf_counter()
    k = 0
    for i, (upserts, deleted) in enumerate(batches):
        if time.perf_counter() - t0 > cap_s:
            break
        k += 1
        tb = time.perf_counter()
        if deleted:
            table.delete(In("id", deleted))
        table.upsert(pa.Table.from_pylist(upserts, schema=ARROW_SCHEMA), join_cols=["id"])
        print(f"  pyiceberg batch {i}: {len(upserts)} upserts, {len(deleted)} deletes, {time.perf_counter() - tb:.1f}s")
    return time.perf_counter() - t0, k


def crossover_events(spark, catalog, work: Path, small: int, big: tuple[float, float, float]) -> float:  # noqa: ANN001
    """Events per batch where our batch time overtakes pyiceberg's: each side's batch time as a line (fixed part +
    per event) through one batch of ``small`` events into fresh tables (created outside the clock) and the main
    run's batches (``big``: events, ours s, pyiceberg s per batch). 0: ours is ahead at ``small`` already; inf:
    pyiceberg's per-event cost is not above ours, so ours never gets ahead."""
    landing = work / "landing_small"
    landing.mkdir()
    batches, final = generate(landing, small, max(small // 5, 1), 1, seed=13)
    create_like_ours(spark, "db.small_ours")
    ours = time_ingest(spark, catalog, landing, "db.small_ours", "merge", len(final))
    theirs, _ = time_pyiceberg(catalog, "db.small_theirs", batches, float("inf"))
    n, ours_big, theirs_big = big
    print(f"one batch of {small:,} events: ours {ours:.2f}s, pyiceberg {theirs:.2f}s; of {n:,.0f} events: ours "
          f"{ours_big:.2f}s, pyiceberg {theirs_big:.2f}s")
    if ours <= theirs:
        return 0.0
    if n <= small:  # no second size to draw the lines through
        return float("nan")
    ours_slope, theirs_slope = (ours_big - ours) / (n - small), (theirs_big - theirs) / (n - small)
    if theirs_slope <= ours_slope:
        return float("inf")
    return small + (ours - theirs) / (theirs_slope - ours_slope)


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
    parser.add_argument("--small-events", type=int, default=2000,
                        help="one batch of this many events, ours and pyiceberg's, for crossover_events")
    parser.add_argument("--cprofile", default="", help="write a cProfile of our driver to this file")
    parser.add_argument("--warm", action="store_true",
                        help="before timing, run our ingestion (both write modes) and the handwritten job once each "
                             "into other tables "
                             "(a daemon's JVM is warm; without it ours runs first, on a cold JVM)")
    parser.add_argument("--warm-rounds", type=int, default=1,
                        help="with --warm: this many untimed rounds of each (the JIT keeps compiling our wider code "
                             "for several batches; a daemon's JVM has run many)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="timed rounds of ours (both write modes), the floor and the handwritten job, each into "
                             "fresh tables, in turn; the RESULT line holds each figure's median over the rounds "
                             "(a warm 2-core machine varies by +-20 %% from run to run)")
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
                                                        **json.loads(os.environ.get("ICECDC_BENCH_SPARK_CONF", "{}"))},
                                                  jdbc_drivers=("sqlite",)))
        catalog = cs.load_pyiceberg()
        attach_catalog(spark, cs)
        catalog.create_namespace("db")
        settings = IngestSettings(landing=str(landing), target="db.ours", identifier_columns=("id",),
                                  auto_create=True, schema=SCHEMA)
        if args.warm:
            tw = time.perf_counter()
            for r in range(args.warm_rounds):
                time_ingest(spark, catalog, landing, f"db.warm{r}", "merge", len(final))
                time_ingest(spark, catalog, landing, f"db.warm_eqdel{r}", "equality_deletes", len(final),
                            ("id", "region"))
                create_like_ours(spark, f"db.hand_warm{r}")
                for path in sorted(landing.iterdir()):
                    handwritten_batch(spark, path, f"bench.db.hand_warm{r}", args.envelope)
            print(f"warm-up (untimed; ours in both write modes and the handwritten job {args.warm_rounds} time(s) "
                  f"each): {time.perf_counter() - tw:.1f}s")
        ours, phases, jobs = run_ours(spark, catalog, settings, args.cprofile)
        got = spark.table("bench.db.ours").count()
        assert got == len(final), (got, len(final))
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
        print_split(ours, phases, jobs)
        handwritten, handwritten_cpu = time_handwritten(spark, landing, args.envelope)
        assert same_rows(spark, "bench.db.ours", "bench.db.hand"), "the handwritten MERGE's table differs from ours"
        print(f"handwritten (JSON read, last image per key, one MERGE per file): {handwritten:.1f}s; "
              f"ours / handwritten = {ours / handwritten:.2f} (tables equal); CPU-s of driver + JVM: ours "
              f"{phases.ours_cpu:.1f}, handwritten {handwritten_cpu:.1f}", flush=True)
        floors = read_floors(spark, landing, args.envelope, phases, handwritten_cpu, settings, typed_in_write(jobs))
        floors = {**floors, **read_split(spark, landing, settings, floors)}
        rounds = [{"ours": ours, "ours_cpu": phases.ours_cpu, "eqdel": eqdel, "floor": floor,
                   "handwritten": handwritten, "handwritten_cpu": handwritten_cpu}]
        for k in range(1, args.rounds):
            rounds.append(timed_round(spark, catalog, landing, args.envelope, len(final), k))
        for k, r in enumerate(rounds):
            print_round(k, r)
        mid = {name: median([r[name] for r in rounds]) for name in rounds[0]}
        ours, eqdel, floor, handwritten = mid["ours"], mid["eqdel"], mid["floor"], mid["handwritten"]
        ours_cpu, handwritten_cpu = mid["ours_cpu"], mid["handwritten_cpu"]
        if args.rounds > 1:
            print(f"medians of {args.rounds} rounds: ours {ours:.2f}s ({ours_cpu:.2f} CPU-s), handwritten "
                  f"{handwritten:.2f}s ({handwritten_cpu:.2f} CPU-s), equality_deletes {eqdel:.2f}s, floor "
                  f"{floor:.2f}s (the RESULT line's figures)", flush=True)

        small = big = float("nan")
        if args.scale_rows:
            small = time_scale(spark, catalog, work, args.scale_small_rows, args.scale_events)
            big = time_scale(spark, catalog, work, args.scale_rows, args.scale_events)
        print(f"one batch of {args.scale_events:,} events: {small:.1f}s into {args.scale_small_rows:,} rows, "
              f"{big:.1f}s into {args.scale_rows:,} rows")

        measured, k = time_pyiceberg(catalog, "db.theirs", batches, args.pyiceberg_cap_s)
        theirs = measured * len(batches) / k
        if k < len(batches):
            print(f"pyiceberg: {k} of {len(batches)} batches in {measured:.1f}s; EXTRAPOLATED linearly to all "
                  f"batches: {theirs:.1f}s")
        else:
            print(f"pyiceberg: all {k} batches in {measured:.1f}s (measured, not extrapolated)")
            got = len(catalog.load_table("db.theirs").scan().to_arrow())
            assert got == len(final), (got, len(final))
        cross = crossover_events(spark, catalog, work, args.small_events,
                                 (args.events / args.files, ours / args.files, theirs / len(batches)))
        spark.stop()
        print(f"RESULT ours_s={ours:.1f} pyiceberg_s={theirs:.1f} ratio={ours / theirs:.3f} floor_s={floor:.1f} "
              f"floor_ratio={ours / floor:.2f} events_per_s={args.events / ours:.0f} driver_peak_mb={driver_mb:.0f} "
              f"target_scale_ratio={big / small:.2f} scale_small_s={small:.1f} scale_big_s={big:.1f}"
              f" handwritten_s={handwritten:.1f} handwritten_ratio={ours / handwritten:.2f}"
              f" ours_cpu_s={ours_cpu:.1f} handwritten_cpu_s={handwritten_cpu:.1f}"
              f" handwritten_cpu_ratio={ours_cpu / handwritten_cpu:.2f} rounds={args.rounds}"
              f" eqdel_s={eqdel:.1f} eqdel_floor_ratio={eqdel / floor:.2f} crossover_events={cross:.0f}"
              f" load1={os.getloadavg()[0]:.2f} warm={int(args.warm) * args.warm_rounds} "
              + " ".join(f"{k}={v:.2f}" for k, v in floors.items()))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
