"""Debezium landing files or stream messages -> Iceberg tables: one batch per file (or bounded group), exactly
once. The one entry: :func:`ingest_files` (landing files) and :func:`ingest_records` (a stream input's batch).

Row work runs in executors: files are read by Spark's text reader, each line named by its line number
(:mod:`landing_lines`), parsed and routed (:mod:`line_parsing`), then coerced per target (:mod:`targets`; or
typed natively, :mod:`native`) and committed (:mod:`commit`) against the ledger (:mod:`ledger`). The driver
only sees aggregates: the distinct (target, field, type) triples and counts.
"""

import functools
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecdc_dagster.errors import CommitDeclinedError, TargetTableMissingError
from icecdc_dagster.ingest import horizon, landing, landing_lines, native, routing, snapshot_epoch
from icecdc_dagster.ingest.columns import NOTES, REASON, TOMBSTONE
from icecdc_dagster.ingest.commit import commit_batch
from icecdc_dagster.ingest.contract import IngestResult, IngestSettings, TargetResult
from icecdc_dagster.ingest.epoch_marks import parsed_markers
from icecdc_dagster.ingest.ledger import LANDING_PROPERTY, home_table, ledger_horizon, read_ledger
from icecdc_dagster.ingest.line_parsing import ORDER_FILE_SHIFT, PARSED_SCHEMA, parse_records
from icecdc_dagster.ingest.native.line_typer import LineTally
from icecdc_dagster.ingest.schema_inference import merge_types
from icecdc_dagster.ingest.targets import (
    PYTHON_RULES,
    RULE_COUNTS,
    coerce_target,
    dead_letter_rows,
    prepare_target,
    python_partition,
    rows_schema,
    table_keys,
)
from icecdc_dagster.ingest.writes import Stamp, TargetWrite
from icecdc_dagster.writer import (
    EQUALITY_DELETES,
    OP_COLUMN,
    ORDER_COLUMN,
    bounds_aggregates,
    bounds_from,
    bounds_of_ranges,
    java_table,
    observation_values,
    table_exists,
)


def ingest_files(spark: Any, catalog_name: str, pyiceberg_catalog: Any, settings: IngestSettings,
                 files: Sequence[str]) -> IngestResult:
    """Ingest one batch (these files, in this order) into its target tables, exactly once.

    Raises:
        TargetTableMissingError: a target table does not exist and the entry does not create it.
        SchemaDeclarationError: the entry's declared schema cannot create a missing table.
        EqualityDeleteTargetError: ``write_mode: equality_deletes`` names a target that cannot take it
            (format version 1, a non-Parquet write format, an unsupported partition transform).
        StagingBranchLostError: a target's staging branch vanished mid-batch (``write_batch``); the
            tables committed before it record the batch, so running it again skips them.
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: Spark or Iceberg refused a read or
            a write; what was committed records the batch, the rest is written when it runs again.
    """
    ledger = read_ledger(spark, catalog_name, settings)
    described = landing.describe(files)
    past = ledger_horizon(settings, ledger)
    recorded_parts = ledger.parts()
    unrecorded = [f for f in described if f.batch_part not in recorded_parts]
    expired = tuple(f.uri for f in horizon.split(unrecorded, past, settings.take_expired_files).set_aside)
    described = [f for f in described if f.uri not in expired]
    bid = landing.batch_id(described)
    uris = tuple(f.uri for f in described)
    if not described or ledger.batches.get(bid):
        return IngestResult(bid, uris, True, expired=expired)
    stamp = Stamp(past.retention(), horizon.file_time(described))
    return replace(_ingest_new(spark, catalog_name, settings, described, bid, uris, stamp), expired=expired)


def _ingest_new(spark: Any, catalog_name: str, settings: IngestSettings, described: Sequence[landing.LandingFile],
                bid: str, uris: tuple[str, ...], stamp: "Stamp") -> IngestResult:
    """A batch no table records yet (or only some of them): read, coerce and commit it."""
    templated = routing.is_template(settings.target)
    if not templated and not settings.auto_create and not table_exists(spark, catalog_name, settings.target):
        raise TargetTableMissingError(f"ingest {settings.landing}: target table {settings.target} does not exist "
                                      "and auto_create is off")
    lines = landing_lines.lines(spark, described)  # Spark's text reader; a line's position key orders its file
    stamp = replace(stamp, line_numbers=functools.partial(landing_lines.line_numbers, spark, described))
    if _native_eligible(spark, catalog_name, settings, templated):
        events = sum(f.size for f in described) // LINE_BYTES_ESTIMATE
        return _ingest_native(spark, catalog_name, settings, lines, native.sample_branches(described), bid, uris,
                              stamp, events)
    return _ingest_python(spark, catalog_name, settings, lines, bid, uris, templated, stamp)


def _ingest_python(spark: Any, catalog_name: str, settings: IngestSettings, lines: DataFrame, bid: str,
                   uris: tuple[str, ...], templated: bool, stamp: "Stamp") -> IngestResult:
    """Lines the native reader cannot take (templated targets, evolving schemas, targets not known before
    reading): parsed by the Python rules, kept while the batch is written (read per target and for dead
    letters)."""
    home = home_table(settings)
    parsed = spark.createDataFrame(lines.rdd.mapPartitions(parse_records(settings.target, home)),
                                   PARSED_SCHEMA).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return _ingest_parsed(spark, catalog_name, settings, parsed, bid, uris, home, templated, stamp)
    finally:
        parsed.unpersist()


def _ingest_parsed(spark: Any, catalog_name: str, settings: IngestSettings, parsed: DataFrame, bid: str,
                   uris: tuple[str, ...], home: str, templated: bool, stamp: "Stamp") -> IngestResult:
    good = parsed.where(F.col("reason").isNull() & (F.col("op") != TOMBSTONE))
    types: dict[str, dict[str, list[str]]] = {}
    order = F.col("file_index") * F.lit(ORDER_FILE_SHIFT) + F.col("source_offset")
    exploded = good.select("target", order.alias("order"), F.posexplode("field_types").alias("pos", "field")).select(
        "target", "order", "pos", F.col("field.name").alias("name"), F.col("field.type").alias("type"))
    triples = exploded.groupBy("target", "name", "type").agg(F.min("pos").alias("pos"),
                                                             F.min("order").alias("first")).collect()
    position: dict[tuple[str, str], Any] = {}
    for r in triples:
        position[(r.target, r.name)] = min(position.get((r.target, r.name), r.pos), r.pos)
    # columns in schema order; for a field seen with several types, the types in event order
    for r in sorted(triples, key=lambda r: (r.target, position[(r.target, r.name)], r.name, r.first)):
        types.setdefault(r.target, {}).setdefault(r.name, []).append(r.type)
    counts_by_target = {r.target: r["count"] for r in parsed.groupBy("target").count().collect()}
    tombstones = parsed.where(F.col("op") == TOMBSTONE).count()
    if not templated and settings.target not in types:
        types[settings.target] = {}
    targets = sorted(types)
    for target in targets:  # fail early, before any write, when a target is missing
        if not settings.auto_create and not table_exists(spark, catalog_name, target):
            raise TargetTableMissingError(f"ingest {settings.landing}: routed target table {target} does not "
                                          "exist and auto_create is off")
    plans: dict[str, DataFrame] = {}
    results: dict[str, TargetResult] = {}
    written_tables: list[str] = []
    dead_by_table: dict[str, DataFrame] = {}
    persisted = []
    for target in targets:
        merged = {name: merge_types(ts) for name, ts in types[target].items()}
        field_types = {name: t for name, t in merged.items() if t is not None}
        if not field_types and not settings.schema and not table_exists(spark, catalog_name, target):
            continue  # nothing valid to create it from: only dead letters this batch
        added_columns, promoted = prepare_target(spark, catalog_name, settings, target, field_types)
        rows, value_promoted = coerce_target(spark, catalog_name, settings, target, good)
        persisted.append(rows)
        plans[target] = rows
        dead_count = rows.where(F.col(REASON).isNotNull()).count()
        rule_counts = {rule: 0 for rule in RULE_COUNTS}
        for rule, n in rows.select(F.explode(NOTES)).groupBy("key").agg(F.sum("value")).collect():
            rule_counts[rule] = int(n)
        results[target] = TargetResult(target, False, None, {"dead_lettered": dead_count, **rule_counts},
                                       tuple(added_columns), tuple(promoted + value_promoted))
        dead_by_table[routing.dead_letter_table(target)] = dead_letter_rows(rows, target)
        written_tables.append(target)
    # Events that failed parsing or routing.
    early_dead = parsed.where(F.col("reason").isNotNull()).select("raw", "reason", "source_file", "source_offset",
                                                                  "target")
    for target in counts_by_target:
        dl_table = home if target == home else routing.dead_letter_table(target)
        part = early_dead.where(F.col("target") == target)
        dead_by_table[dl_table] = dead_by_table[dl_table].unionByName(part) if dl_table in dead_by_table else part
    dead_counts = {t: df.count() for t, df in dead_by_table.items()}
    dl_tables = sorted(t for t, n in dead_counts.items() if n)
    if not written_tables and not dl_tables:  # the batch is still recorded: in the home table
        dl_tables = [home]
        dead_by_table.setdefault(home, early_dead)
    for dl_table in dl_tables:  # a target's dead letters include those of parsing and routing
        owner = dl_table[: -len("__dead_letters")]
        if owner in results:
            results[owner] = replace(results[owner], counts={**results[owner].counts,
                                                             "dead_lettered": dead_counts[dl_table]})
    try:
        writes = [TargetWrite(target, plans[target].where(F.col(REASON).isNull()),
                               [f.name for f in spark.table(f"{catalog_name}.{target}").schema.fields],
                               table_keys(spark, catalog_name, settings, target)) for target in written_tables]
        results = commit_batch(spark, catalog_name, settings, bid, {t: dead_by_table[t] for t in dl_tables},
                                writes, results, stamp, parsed_markers(parsed, settings))
    finally:
        for df in persisted:
            df.unpersist()
    return IngestResult(bid, uris, False, results, int(tombstones), int(sum(counts_by_target.values())))


def _native_eligible(spark: Any, catalog_name: str, settings: IngestSettings, templated: bool) -> bool:
    """Whether the batch can be read by Spark's JSON reader (:mod:`native`): a fixed target whose columns are
    known before reading (it exists, or is declared) and not evolved from the events."""
    if templated or settings.schema_evolution:
        return False
    return table_exists(spark, catalog_name, settings.target) or bool(settings.auto_create and settings.schema)


@dataclass(frozen=True)
class NativeRead:
    """A batch's lines typed natively for its fixed target, planned but not computed (:func:`native_read`)."""

    frame: DataFrame  # native.coerce_lines' rows (+ the snapshot marker column when the entry marks deletes)
    fields: list[T.StructField]  # the target's columns
    keys: tuple[str, ...]
    added_columns: list[str]
    marking: bool  # ``frame`` carries the snapshot marker column
    tally: LineTally | None = None  # what the JVM typer counts as it makes ``frame``'s rows (None: not it)

    def figures(self) -> list[Column]:
        """The batch's figures, to observe while ``frame`` is computed (no job of their own): how many lines the
        Python rules must take, how many carry a snapshot marker and, for the common batch that the native
        reading types whole, every figure of the batch, its key range too. None where the typer tallies them
        (built when asked)."""
        if self.tally is not None:
            return []
        marker = F.col(snapshot_epoch.MARKER_COLUMN)
        return [F.sum((~F.col(native.FAST)).cast("long")).alias("_routed"),
                *([F.sum(marker.isNotNull().cast("long")).alias("_marked")] if self.marking else []),
                *_stats_aggregates(self.keys, T.StructType(self.fields), F.col(native.FAST))]


def native_read(spark: Any, catalog_name: str, settings: IngestSettings, lines: DataFrame,
                branches: Sequence[Any]) -> NativeRead:
    """The native typing of a batch into ``settings.target`` (created first when the entry auto-creates it), as
    :func:`_ingest_native` computes it, with the figures it observes meanwhile. Nothing runs yet: the batch
    computes it once, in its checkpoint; public so that a measurement prices the typing on the very frame a
    batch computes (bench/ingest.py), with and without the figures and the checkpoint."""
    target = settings.target
    added_columns, _ = prepare_target(spark, catalog_name, settings, target, {})
    fields = spark.table(f"{catalog_name}.{target}").schema.fields
    keys = table_keys(spark, catalog_name, settings, target)
    known = [f.name for f in fields]
    marking = settings.snapshot_deletes
    extra = [snapshot_epoch.marker(F.col("raw")).alias(snapshot_epoch.MARKER_COLUMN)] if marking else []
    typed = native.coerce_lines(lines, native.columns_of(T.StructType(fields)), keys, known, native.utc(spark),
                                ORDER_FILE_SHIFT, branches, extra)
    return NativeRead(typed.frame, fields, keys, added_columns, marking, typed.tally)


def _ingest_native(spark: Any, catalog_name: str, settings: IngestSettings, lines: DataFrame,
                   branches: Sequence[Any], bid: str, uris: tuple[str, ...], stamp: Stamp,
                   events: int) -> IngestResult:
    """One batch into a fixed target: native reading and typing, the Python rules only for routed lines.
    ``lines``: the batch as ``native.LINE_SCHEMA`` rows (landing lines or stream messages); ``branches``: the
    schema blocks sampled from its first lines; ``events``: about how many lines it holds (not counted)."""
    target = settings.target
    read = native_read(spark, catalog_name, settings, lines, branches)
    line = (catalog_name, settings.landing, target)
    if line not in _NOT_WHOLE and _in_one_job(spark, catalog_name, settings, read.keys, events):
        done = _ingest_in_one_job(spark, catalog_name, settings, read, bid, uris, stamp)
        if done is not None:
            return done
    fields, keys, added_columns = read.fields, read.keys, read.added_columns
    known = [f.name for f in fields]
    marking = settings.snapshot_deletes
    schema = T.StructType(fields)
    marker = F.col(snapshot_epoch.MARKER_COLUMN)
    # The figures arrive with the checkpoint (the typer's tally, an observation); one aggregate over the
    # checkpoint where the observation does not.
    frame, arrived = _figures_after_write(read, timeout_s=120.0)
    classified = _checkpointed(frame)
    first = arrived() or _aggregated(classified, read.figures())
    _remember_whole(line, first)
    markers: dict[str, list[tuple[int, str]]] = {}
    if marking and first["_marked"]:
        # every line: the native reason of a line left to the Python rules is not final
        found = classified.where(marker.isNotNull()).select(ORDER_COLUMN, snapshot_epoch.MARKER_COLUMN).collect()
        markers = snapshot_epoch.markers_by_target((target, r[0], r[1]) for r in found)
    fast, routed = native.split(classified.drop(snapshot_epoch.MARKER_COLUMN))
    held = [classified]
    rows, stats = fast, first
    if first["_routed"]:  # no Python worker at all for a batch the native reading types whole (the common case)
        columns = [(f.name, f.dataType.json(), f.nullable) for f in fields]
        slow = _checkpointed(spark.createDataFrame(  # once: the stats, dead letters and the MERGE all read it
            routed.rdd.mapPartitions(python_partition(columns, keys, set(known), False)), rows_schema(fields)))
        held.append(slow)
        rows = fast.unionByName(slow)
    try:
        if first["_routed"]:
            recount = rows.agg(*_stats_aggregates(keys, schema)).first()
            assert recount is not None
            stats = recount.asDict()
        dead_count = int(stats["dead_lettered"] or 0)
        counts = _figure_counts(stats)
        dead = {routing.dead_letter_table(target): dead_letter_rows(rows, target)} if dead_count else {}
        good = rows.where(F.col(REASON).isNull() & (F.col(OP_COLUMN) != TOMBSTONE))
        bounds = (bounds_of_ranges(read.tally.ranges(), keys, schema) if read.tally is not None
                  and not first["_routed"] else bounds_from(stats, keys, schema))
        write = TargetWrite(target, good, known, keys, bounds)
        results = commit_batch(spark, catalog_name, settings, bid, dead, [write], {
            target: TargetResult(target, False, None, counts, tuple(added_columns), ())}, stamp, markers)
    finally:
        for frame in held:
            _release(frame)
    return IngestResult(bid, uris, False, results, int(stats["tombstones"] or 0), int(stats["events_read"] or 0))


# Lines (catalog, landing, target) whose last batch read checkpointed was not whole (a dead letter, a line for
# the Python rules, a snapshot marker): their next batch is read checkpointed, not typed in its write first. Why:
# a declined one-job batch did its write for nothing; a stream with a bad line in every batch would pay twice.
_NOT_WHOLE: set[tuple[str, str, str]] = set()


def _remember_whole(line: tuple[str, str, str], figures: dict[str, Any]) -> None:
    """Note whether ``line``'s batch with these figures (:meth:`NativeRead.figures`) was whole (:data:`_NOT_WHOLE`)."""
    if figures["_routed"] or figures.get("_marked") or figures["dead_lettered"]:
        _NOT_WHOLE.add(line)
    else:
        _NOT_WHOLE.discard(line)


# A MERGE target of at most max(ONE_JOB_MERGE_ROWS, ONE_JOB_ROWS_PER_EVENT x the batch's events) rows takes a
# batch typed inside its MERGE (no key range first). Why: the checkpoint the key range needs costs ~3 us of CPU
# per event (0.3 CPU-s a 100k-event batch, bench/ingest.py); the MERGE's read of target files the key range would
# have skipped ~0.1-0.3 us per row (keys and positions). Below the bound the checkpoint costs more than any read
# it could save; above it, the key range pays for its job (the MERGE skips the files it misses, or a batch of new
# keys is appended).
ONE_JOB_MERGE_ROWS = 100_000
ONE_JOB_ROWS_PER_EVENT = 10
LINE_BYTES_ESTIMATE = 150  # a plain Debezium line's size, for a landing batch's events from its files' bytes


def _in_one_job(spark: Any, catalog_name: str, settings: IngestSettings, keys: Sequence[str], events: int) -> bool:
    """Whether the batch (about ``events`` lines) may be typed inside its write (:func:`_ingest_in_one_job`): a
    keyed target whose write needs none of the batch's figures first (equality deletes never read the target; a
    MERGE reads a target small against the batch whole: :func:`_small_target`), with no Debezium snapshot open
    in it (the snapshot's marks would read the rows a second time)."""
    if not keys:
        return False
    table = f"{catalog_name}.{settings.target}"
    if settings.mode_for(settings.target) != EQUALITY_DELETES and not _small_target(spark, table, events):
        return False
    return not settings.snapshot_deletes or snapshot_epoch.open_epoch(
        spark, table, LANDING_PROPERTY, settings.landing) is None


def _small_target(spark: Any, table: str, events: int) -> bool:
    """Whether ``table`` holds at most max(:data:`ONE_JOB_MERGE_ROWS`, :data:`ONE_JOB_ROWS_PER_EVENT` x
    ``events``) rows by its current snapshot's summary."""
    current = java_table(spark, table).currentSnapshot()
    total = None if current is None else current.summary().get("total-records")
    return total is None or int(total) <= max(ONE_JOB_MERGE_ROWS, ONE_JOB_ROWS_PER_EVENT * events)


def _ingest_in_one_job(spark: Any, catalog_name: str, settings: IngestSettings, read: NativeRead, bid: str,
                       uris: tuple[str, ...], stamp: Stamp) -> IngestResult | None:
    """The batch typed inside its write (equality deletes: one Spark job; a MERGE: its own jobs), no checkpoint,
    committed only when its figures (counted by that write, known before the commit) say the native typing took
    it whole: no line for the Python rules, no dead letter, no snapshot marker. None when they do not (the
    written files are deleted, nothing is committed) or when the batch was committed before (nothing read): the
    caller reads it again, checkpointed, as it reads any batch. Why: the checkpoint's own job was 0.3 of a 0.8 s
    equality-delta batch."""
    target = settings.target
    frame, arrived = _figures_after_write(read)
    good = frame.drop(snapshot_epoch.MARKER_COLUMN).where(F.col(REASON).isNull() & (F.col(OP_COLUMN) != TOMBSTONE))
    figures: dict[str, Any] = {}

    def whole() -> bool:
        got = arrived()
        if got is None or got["_routed"] or got.get("_marked") or got["dead_lettered"]:
            return False
        figures.update(got)
        return True

    write = TargetWrite(target, good, [f.name for f in read.fields], read.keys, before_commit=whole)
    start = {target: TargetResult(target, False, None, {}, tuple(read.added_columns), ())}
    try:
        results = commit_batch(spark, catalog_name, settings, bid, {}, [write], start, stamp, {})
    except CommitDeclinedError:
        return None
    if not figures:
        return None
    results = {target: replace(results[target], counts={**_figure_counts(figures), **results[target].counts})}
    return IngestResult(bid, uris, False, results, int(figures["tombstones"] or 0), int(figures["events_read"] or 0))


def _figures_after_write(read: NativeRead, timeout_s: float = 30.0
                         ) -> tuple[DataFrame, Callable[[], dict[str, Any] | None]]:
    """``read``'s rows for the one job that computes them (a write, a checkpoint), and what gives the batch's
    figures once it has: the JVM typer's tally (counted as the rows are made, since now: a declined one-job
    write made the same rows before; why: an observation's aggregate is planned with each batch and evaluated
    per row, ~0.1 s of a 1.4 s batch), else Spark's observation of the rows (None when it did not arrive within
    ``timeout_s``)."""
    if read.tally is not None:
        tally, before = read.tally, read.tally.figures()
        return read.frame, lambda: _tallied(_counted_since(tally, before))
    observed = Observation(f"icecdc_lines_{uuid.uuid4().hex}")
    return read.frame.observe(observed, *read.figures()), lambda: observation_values(observed, timeout_s=timeout_s)


def _aggregated(frame: DataFrame, figures: list[Column]) -> dict[str, Any]:
    """``figures`` as one aggregate over ``frame`` (where their observation did not arrive)."""
    row = frame.agg(*figures).first()
    assert row is not None, "an aggregate without grouping has one row"
    return row.asDict()


def _counted_since(tally: LineTally, before: dict[str, int]) -> dict[str, int]:
    """What ``tally`` counted since it held ``before`` (the rows of one computation of the frame)."""
    return {k: v - before[k] for k, v in tally.figures().items()}


def _tallied(counted: dict[str, int]) -> dict[str, int]:
    """The typer's tally under the names of :meth:`NativeRead.figures` (a row the JVM typer makes whole notes
    no rule but ignored fields; its only extra column is the snapshot marker)."""
    return {"events_read": counted["events_read"], "tombstones": counted["tombstones"],
            "dead_lettered": counted["dead_lettered"], PYTHON_RULES: 0,
            **{rule: counted.get(rule, 0) for rule in RULE_COUNTS},
            "_routed": counted["routed"], "_marked": counted["extra_set"]}


def _figure_counts(figures: Any) -> dict[str, int]:
    """A target's counts from the batch's figures (:func:`_stats_aggregates`): dead letters and rule notes."""
    return {"dead_lettered": int(figures["dead_lettered"] or 0), PYTHON_RULES: int(figures[PYTHON_RULES] or 0),
            **{rule: int(figures[rule] or 0) for rule in RULE_COUNTS}}


def _stats_aggregates(keys: Sequence[str], schema: T.StructType, where: Column | None = None) -> list[Column]:
    """A batch's figures over its typed rows (only those ``where`` holds for): events, tombstones, dead
    letters, the Python rules' notes and the key range."""
    def only(value: Column) -> Column:
        return value if where is None else F.when(where, value)
    rule_sums = [F.sum(only(F.coalesce(F.col(NOTES)[rule], F.lit(0)))).alias(rule) for rule in RULE_COUNTS]
    return [F.count(only(F.lit(1))).alias("events_read"),
            F.sum(only((F.col(OP_COLUMN) == TOMBSTONE).cast("long"))).alias("tombstones"),
            F.sum(only(F.col(REASON).isNotNull().cast("long"))).alias("dead_lettered"),
            F.sum(only(F.coalesce(F.col(NOTES)[PYTHON_RULES], F.lit(0)))).alias(PYTHON_RULES),
            *rule_sums, *bounds_aggregates(keys, schema, where=where)]


def _checkpointed(frame: DataFrame) -> DataFrame:
    """``frame`` computed once and cut from its plan (Spark's local checkpoint, in executors' memory and disk).

    Why not ``persist``: every later plan (the stats, the dead letters, the MERGE and its count join) would carry
    and re-analyse the whole JSON reading and typing again, and the landing reader's positions come from
    nondeterministic expressions (``landing_lines``), which a copy-on-write MERGE refuses in its source. A lost
    executor fails the batch instead of recomputing it: nothing is published, the next run ingests it again."""
    return frame.localCheckpoint(eager=True)


def _release(checkpointed: DataFrame) -> None:
    """Drop the blocks of a :func:`_checkpointed` frame now (Spark would drop them only once it is garbage)."""
    checkpointed._jdf.queryExecution().analyzed().rdd().unpersist(False)  # noqa: SLF001 - its LogicalRDD's blocks


def ingest_records(spark: Any, catalog_name: str, settings: IngestSettings, bid: str,
                   records: Sequence[tuple[str, bytes]]) -> IngestResult:
    """Ingest one stream batch (messages in source-position order, each ``(position, bytes)``) exactly once.

    Every message takes the path of a landing line: the same parsing, routing, coercion, dead letters,
    tombstones and per-key ordering (its index in the batch orders it, as a line's offset does); a dead
    letter names ``<source>#<position>``. ``settings.landing`` is the input's ledger name. The batch is stamped
    with its commit time, and the ledger's entries older than ``max_file_age`` before it are dropped.

    Raises:
        The errors of :func:`ingest_files`, for the same reasons and with the same recovery.
    """
    ledger = read_ledger(spark, catalog_name, settings)
    if ledger.batches.get(bid):
        return IngestResult(bid, (settings.landing,), True)
    committed_ms = horizon.now_ms()
    stamp = Stamp(horizon.stream_horizon(settings.max_file_age_s, committed_ms, ledger.summaries,
                                          ledger.properties).retention(), str(committed_ms))
    templated = routing.is_template(settings.target)
    if not templated and not settings.auto_create and not table_exists(spark, catalog_name, settings.target):
        raise TargetTableMissingError(f"ingest {settings.landing}: target table {settings.target} does not exist "
                                      "and auto_create is off")
    texts = [data.decode("utf-8", errors="replace") for _, data in records]
    rows = [(0, f"{settings.landing}#{position}", index, text)
            for index, ((position, _), text) in enumerate(zip(records, texts, strict=True))]
    slices = max(min(len(rows) // 5000, int(spark.sparkContext.defaultParallelism)), 1)
    lines = spark.createDataFrame(spark.sparkContext.parallelize(rows, slices), native.LINE_SCHEMA)
    uris = (settings.landing,)
    if _native_eligible(spark, catalog_name, settings, templated):
        return _ingest_native(spark, catalog_name, settings, lines, native.sample_records(texts), bid, uris, stamp,
                              len(records))
    return _ingest_python(spark, catalog_name, settings, lines, bid, uris, templated, stamp)
