"""Exactly-once commits: the batch id lives in the snapshot summary, the write is staged on a branch.

A batch is written to the table's staging branch first (data files + a snapshot that ``main``
does not see) and published by fast-forwarding ``main`` to it. A crash before the publish leaves
the branch ahead of ``main``; the next attempt resets it to ``main`` (its files become orphans), so
``main`` never holds half a batch. The ledger is ``main``'s history: a batch whose id is in an
ancestor's summary is skipped.

The staging branch is kept between batches (after a publish it points at ``main``'s snapshot), so
a batch costs two metadata commits: the write to the branch and the publish. It is created (or reset
to ``main``) only when missing or behind ``main`` (first batch, after a crash, after maintenance
committed to ``main``). Its ``max-ref-age-ms`` is 1 ms: ``expire_snapshots`` drops the ref and its
snapshot like any other, so a branch never pins old files; the next batch re-creates it.

Maintenance of the table itself (``rewrite_data_files`` + ``expire_snapshots``) removes those
summaries, so the publish also writes, in the SAME metadata commit (one Iceberg transaction:
fast-forward + property update), table properties that no expiry touches: the last batch's
summary properties (``icecdc.last-batch``: a replica's checkpoint) and, for ingest targets, the
ledger of every batch id (``icecdc.ledger``, compressed). Readers take the union of both.

The ledger is kept in chunks so that a publish costs the same at the 100,000th batch as at the
first: ``icecdc.ledger`` holds the newest entries (fewer than ``LEDGER_CHUNK_ENTRIES``); when it is
full it becomes the sealed chunk ``icecdc.ledger.<n>``, never rewritten again (and decoded once per
process). A publish re-encodes at most one chunk; every metadata commit still carries every chunk
(~26 bytes per batch compressed, docs/ingestion.md, "Exactly once").

A ledger can be bounded (:class:`LedgerRetention`): entries whose stamp (an integer in the entry, e.g. an
ingest's landing-file time) is below a horizon are dropped at publish: from the open chunk when it is
re-encoded, and a sealed chunk as a whole once every entry in it is below. The highest stamp ever dropped
is kept (``icecdc.ledger-dropped-upto``): a caller knows that the ledger no longer answers for anything
stamped at or below it.
"""

import base64
import json
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Generic, TypeVar

from icecdc_dagster.errors import CommitDeclinedError, StagingBranchLostError
from icecdc_dagster.runtime.java import java_map

BATCH_ID_PROPERTY = "icecdc.batch-id"
LAST_BATCH_PROPERTY = "icecdc.last-batch"  # table property: JSON of the last published batch's summary properties
LEDGER_PROPERTY = "icecdc.ledger"          # table property: zlib+base64 JSON list of recorded batches' properties
LEDGER_SEALED_PREFIX = LEDGER_PROPERTY + "."  # + n: sealed chunks of the ledger (oldest first), never rewritten
LEDGER_CHUNK_ENTRIES = 1000
LEDGER_DROPPED_PROPERTY = "icecdc.ledger-dropped-upto"  # table property: the highest stamp a retention dropped
TARGET_SNAPSHOT_KEY = "icecdc.target-snapshot-id"  # in LAST_BATCH_PROPERTY: the snapshot the batch published
STAGING_BRANCH = "icecdc_stage"
STAGING_MAX_REF_AGE_MS = 1  # expire_snapshots drops the staging ref (and its snapshot) whenever it runs

T = TypeVar("T")


def java_table(spark: Any, table: str) -> Any:
    """The Iceberg Java ``Table`` of a Spark table name (fresh metadata, no cache).

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: no such table, or the catalog cannot load it
            (passes through).
    """
    return spark._jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, table)


def main_ancestors(jtable: Any) -> Iterator[Any]:
    """Snapshots of ``main`` from the current one back to the first (Java objects).

    Raises:
        py4j.protocol.Py4JJavaError: the Java table cannot be read (passes through); nothing of its own.
    """
    snap = jtable.currentSnapshot()
    while snap is not None:
        yield snap
        parent = snap.parentId()
        snap = jtable.snapshot(parent) if parent is not None else None


def committed_summaries(spark: Any, table: str) -> Iterator[tuple[int, int, dict[str, str]]]:
    """(snapshot id, sequence number, summary) of ``main``'s ancestors, newest first.

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: the table or its snapshots cannot be read
            (passes through); nothing of its own.
    """
    for snap in main_ancestors(java_table(spark, table)):
        yield int(snap.snapshotId()), int(snap.sequenceNumber()), java_map(snap.summary())


def table_properties(jtable: Any) -> dict[str, str]:
    """A Java table's properties as a Python dict.

    Raises:
        py4j.protocol.Py4JJavaError: the Java table cannot be read (passes through); nothing of its own.
    """
    return java_map(jtable.properties())


def decode_ledger(value: str | None) -> list[dict[str, str]]:
    if not value:
        return []
    return json.loads(zlib.decompress(base64.b64decode(value)).decode("utf-8"))


def encode_ledger(entries: list[dict[str, str]]) -> str:
    return base64.b64encode(zlib.compress(json.dumps(entries, separators=(",", ":")).encode("utf-8"), 9)).decode()


@lru_cache(maxsize=1024)
def _sealed_chunk(value: str) -> tuple[dict[str, str], ...]:
    return tuple(decode_ledger(value))


def _sealed_chunks(properties: dict[str, str]) -> list[tuple[int, str]]:
    chunks = [(key[len(LEDGER_SEALED_PREFIX):], value) for key, value in properties.items()
              if key.startswith(LEDGER_SEALED_PREFIX)]
    return sorted((int(n), value) for n, value in chunks if n.isdigit())


def ledger_entries(properties: dict[str, str]) -> list[dict[str, str]]:
    """Every ledger entry of a table's properties, oldest first (sealed chunks, then the open one).

    Raises:
        json.JSONDecodeError: a ledger property holds no JSON (edited by hand); nothing of its own.
    """
    entries: list[dict[str, str]] = []
    for _, value in _sealed_chunks(properties):
        entries.extend(_sealed_chunk(value))
    entries.extend(decode_ledger(properties.get(LEDGER_PROPERTY)))
    return entries


@dataclass(frozen=True)
class LedgerRetention:
    """Which ledger entries a publish keeps: those whose integer ``stamp_key`` is ``>= keep_from`` (and every
    entry without one). The entry being appended is always kept, so a batch cut short between two tables is
    still known when it is completed."""

    stamp_key: str
    keep_from: int

    def stamp(self, entry: Mapping[str, str]) -> int | None:
        value = entry.get(self.stamp_key)
        return int(value) if value else None

    def drops(self, entry: Mapping[str, str]) -> bool:
        stamp = self.stamp(entry)
        return stamp is not None and stamp < self.keep_from


@dataclass(frozen=True)
class LedgerChanges:
    """Table properties a publish sets and removes so that the ledger holds a new entry (and no expired one)."""

    updates: dict[str, str]
    removals: tuple[str, ...] = ()


def ledger_update(properties: dict[str, str], entry: dict[str, str],
                  chunk_entries: int = LEDGER_CHUNK_ENTRIES) -> dict[str, str]:
    """The table properties to set so that the ledger also holds ``entry``: the open chunk re-encoded, or,
    once it is full, sealed under the next number (and an empty open chunk)."""
    return ledger_changes(properties, entry, chunk_entries).updates


def ledger_changes(properties: dict[str, str], entry: dict[str, str], chunk_entries: int = LEDGER_CHUNK_ENTRIES,
                   retention: LedgerRetention | None = None) -> LedgerChanges:
    """:func:`ledger_update`, and with a ``retention`` the entries below its horizon dropped: the open chunk's
    at once, a sealed chunk (never rewritten) when all of its entries are below. Records the highest stamp
    dropped in ``LEDGER_DROPPED_PROPERTY``."""
    open_chunk = decode_ledger(properties.get(LEDGER_PROPERTY))
    sealed = _sealed_chunks(properties)
    removed: list[str] = []
    dropped: list[int] = []
    if retention is not None:
        kept = [e for e in open_chunk if not retention.drops(e)]
        dropped += [retention.stamp(e) or 0 for e in open_chunk if retention.drops(e)]
        open_chunk = kept
        for number, value in sealed:
            chunk = _sealed_chunk(value)
            if chunk and all(retention.drops(e) for e in chunk):
                removed.append(f"{LEDGER_SEALED_PREFIX}{number}")
                dropped += [retention.stamp(e) or 0 for e in chunk]
    open_chunk.append(entry)
    changes: dict[str, str] = {}
    if dropped:
        prior = int(properties.get(LEDGER_DROPPED_PROPERTY) or -(2 ** 62))
        changes[LEDGER_DROPPED_PROPERTY] = str(max(prior, *dropped))
    if len(open_chunk) < chunk_entries:
        return LedgerChanges({**changes, LEDGER_PROPERTY: encode_ledger(open_chunk)}, tuple(removed))
    number = sealed[-1][0] + 1 if sealed else 0
    changes.update({f"{LEDGER_SEALED_PREFIX}{number}": encode_ledger(open_chunk), LEDGER_PROPERTY: encode_ledger([])})
    return LedgerChanges(changes, tuple(removed))


def ledger_dropped_upto(properties: Mapping[str, str]) -> int | None:
    """The highest stamp a retention dropped from this ledger (None: nothing was ever dropped).

    Raises:
        ValueError: the property is not an integer (edited by hand); nothing of its own.
    """
    value = properties.get(LEDGER_DROPPED_PROPERTY)
    return int(value) if value else None


def last_batch(jtable: Any) -> dict[str, str] | None:
    """The summary properties of the last batch published to ``main`` (a table property: survives expiry).

    Raises:
        json.JSONDecodeError: the table property holds no JSON (edited by hand); nothing of its own.
    """
    return last_batch_in(jtable.properties())


def last_batch_in(properties: Mapping[str, str]) -> dict[str, str] | None:
    """:func:`last_batch` from the table's properties, however they were read (Spark or pyiceberg).

    Raises:
        json.JSONDecodeError: the table property holds no JSON (edited by hand).
    """
    value = properties.get(LAST_BATCH_PROPERTY)
    return json.loads(value) if value else None


def recorded_summaries(spark: Any, table: str) -> Iterator[dict[str, str]]:
    """Summary properties of every batch the table records: ``main``'s newest ancestors, then the ledger
    property (oldest first), which survives compaction and snapshot expiry.

    The ledger is appended in the same commit that publishes a batch, so once the walk back from the
    current snapshot meets a batch the ledger holds, the ledger holds every older batch too: the walk
    stops there, and its cost is the few snapshots since the last batch, not the table's history
    (a table without a ledger is walked to its first snapshot).

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: the table cannot be read (passes through);
            nothing of its own.
    """
    jtable = java_table(spark, table)
    yield from recorded_in(table_properties(jtable), (java_map(snap.summary()) for snap in main_ancestors(jtable)))


def recorded_in(properties: dict[str, str], summaries: Iterable[dict[str, str]]) -> Iterator[dict[str, str]]:
    """:func:`recorded_summaries` from the table's properties and ``main``'s summaries newest first,
    however they were read (through Spark in runs, from metadata by pyiceberg in ``icecdc status``)."""
    ledger = ledger_entries(properties)
    in_ledger = {entry[BATCH_ID_PROPERTY] for entry in ledger if BATCH_ID_PROPERTY in entry}
    for summary in summaries:
        if summary.get(BATCH_ID_PROPERTY) in in_ledger:
            break
        yield summary
    yield from ledger


def committed_batch_ids(spark: Any, table: str) -> set[str]:
    """Every batch id a snapshot summary of ``table`` records (what was committed exactly once).

    Raises:
        pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: the table or its snapshots cannot be read
            (passes through); nothing of its own.
    """
    return {s[BATCH_ID_PROPERTY] for s in recorded_summaries(spark, table) if BATCH_ID_PROPERTY in s}


def is_committed(spark: Any, table: str, batch_id: str, ledger: bool) -> bool:
    """Whether ``batch_id`` is in ``main``. A ledger table answers from its ledger (every batch);
    otherwise the newest batch on ``main`` decides: older batches are refused by the writer's own
    checkpoint (a replica applies in order), so the walk stops at the first batch it meets."""
    if ledger:
        return batch_id in committed_batch_ids(spark, table)
    for snap in main_ancestors(java_table(spark, table)):
        newest = snap.summary().get(BATCH_ID_PROPERTY)
        if newest is not None:
            return bool(newest == batch_id)
    return False


@contextmanager
def commit_properties(spark: Any, properties: dict[str, str]) -> Iterator[None]:
    """Snapshot summary properties for SQL writes (MERGE) run on this thread.

    Same effect as ``CommitMetadata.withCommitProperties`` (its thread-local), without
    needing a py4j callback server; PySpark pins each Python thread to one JVM thread.
    """
    jvm = spark._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    cls = jvm.java.lang.Class.forName("org.apache.iceberg.spark.CommitMetadata", True, loader)
    field = cls.getDeclaredField("COMMIT_PROPERTIES")
    field.setAccessible(True)
    local = field.get(None)
    props = jvm.java.util.HashMap()
    for key, value in properties.items():
        props.put(key, str(value))
    local.set(props)
    try:
        yield
    finally:
        local.remove()


@dataclass(frozen=True)
class Published(Generic[T]):
    """What :func:`staged_commit` published: the write's result and the batch's snapshot on ``main``."""

    result: T
    snapshot_id: int
    parent_id: int | None                 # the snapshot the batch was staged on (what the write read)
    summary: dict[str, str]               # the batch snapshot's summary
    parent_summary: dict[str, str] | None
    format_version: int
    single_commit: bool                   # the write made exactly one snapshot on the branch
    jtable: Any = None                    # the Java table, fresh after the publish


def _stage(jtable: Any) -> None:
    """Point the staging branch at ``main``'s current snapshot: no commit when it already does (every batch
    after the first), one commit otherwise (first batch, a crashed attempt's leftover, maintenance on ``main``)."""
    main = jtable.currentSnapshot()
    main_id = None if main is None else int(main.snapshotId())
    ref = jtable.refs().get(STAGING_BRANCH)
    if ref is not None and main_id is not None and int(ref.snapshotId()) == main_id:
        return
    if ref is not None and main_id is None:
        # A previous attempt on an empty table died before publishing: its files become orphans.
        jtable.manageSnapshots().removeBranch(STAGING_BRANCH).commit()
        jtable.refresh()
        ref = None
    if main_id is None:
        jtable.manageSnapshots().createBranch(STAGING_BRANCH).commit()  # an empty table: an empty snapshot
        jtable.refresh()
        jtable.manageSnapshots().setMaxRefAgeMs(STAGING_BRANCH, STAGING_MAX_REF_AGE_MS).commit()
    else:
        ops = jtable.manageSnapshots()
        # replace: a previous attempt died before publishing (its files become orphans), or main moved
        ops = ops.replaceBranch(STAGING_BRANCH, main_id) if ref is not None else ops.createBranch(STAGING_BRANCH,
                                                                                                   main_id)
        ops.setMaxRefAgeMs(STAGING_BRANCH, STAGING_MAX_REF_AGE_MS).commit()
    jtable.refresh()


def staged_commit(spark: Any, table: str, properties: dict[str, str], write: Callable[[str], T],
                  ledger: bool = False, retention: LedgerRetention | None = None,
                  before_publish: Callable[[], bool] | None = None) -> Published[T]:
    """Run ``write(branch_table_name)`` on the staging branch (at ``main``'s snapshot), then publish it to ``main``.

    ``ledger``: also append the batch to the table's ledger property (ingest targets: every batch id
    must stay known after expiry); ``retention``: drop the ledger's expired entries in the same commit.
    ``before_publish``: asked once the write is staged; False discards it (:func:`_discard_staged`). Why: a
    caller can write rows it has not computed before and publish them only if they turn out whole.
    Returns the write's result and the published snapshot.

    Raises:
        CommitDeclinedError: ``before_publish`` said False; the staged files are deleted, nothing published.
        StagingBranchLostError: the staging branch vanished during the write (nothing published).
    """
    jtable = java_table(spark, table)
    _stage(jtable)
    staged_from = _branch_head(jtable, table)
    with commit_properties(spark, properties):
        result = write(f"{table}.branch_{STAGING_BRANCH}")
    jtable.refresh()
    if before_publish is not None and not before_publish():
        _discard_staged(jtable, table, int(staged_from.snapshotId()))
        raise CommitDeclinedError(f"{table}: batch {properties.get(BATCH_ID_PROPERTY, '?')} declined before its "
                                  "publish (staged, discarded)")
    staged = _branch_head(jtable, table)
    if staged.snapshotId() == staged_from.snapshotId():
        # Nothing to write (all events dead-lettered, cancelled or tombstones): still record the batch.
        append = jtable.newAppend().toBranch(STAGING_BRANCH)
        for key, value in properties.items():
            append = append.set(key, str(value))
        append.commit()
        jtable.refresh()
        staged = _branch_head(jtable, table)
    snapshot_id = publish(jtable, {k: str(v) for k, v in properties.items()}, ledger, table, retention)
    parent = staged.parentId()
    parent_snapshot = jtable.snapshot(parent) if parent is not None else None
    return Published(result, snapshot_id, None if parent is None else int(parent), java_map(staged.summary()),
                     None if parent_snapshot is None else java_map(parent_snapshot.summary()),
                     int(jtable.operations().current().formatVersion()),
                     parent is not None and int(parent) == int(staged_from.snapshotId()), jtable)


def _discard_staged(jtable: Any, table: str, staged_from: int) -> None:
    """Undo what a write staged since ``staged_from``: the branch back at ``main`` (removed on an empty table, as a
    crashed attempt's), then the files its snapshots added deleted. The snapshots stay in the metadata, named by
    no ref, until an expiry drops them (their manifests are kept: an expiry reads them; a data file it then finds
    gone is nothing to delete)."""
    io = jtable.io()
    doomed = []
    snap = _branch_head(jtable, table)
    while snap is not None and int(snap.snapshotId()) != staged_from:
        doomed.append(snap)
        parent = snap.parentId()
        snap = None if parent is None else jtable.snapshot(parent)
    main = jtable.currentSnapshot()
    ops = jtable.manageSnapshots()
    if main is None:
        ops.removeBranch(STAGING_BRANCH).commit()
    else:
        ops.replaceBranch(STAGING_BRANCH, main.snapshotId()).commit()
    jtable.refresh()
    for snapshot in doomed:
        for files in (snapshot.addedDataFiles(io), snapshot.addedDeleteFiles(io)):
            found = files.iterator()
            while found.hasNext():
                io.deleteFile(found.next().location())


def _branch_head(jtable: Any, table: str) -> Any:
    snap = jtable.snapshot(STAGING_BRANCH)
    if snap is None:
        raise StagingBranchLostError(f"{table}: the staging branch {STAGING_BRANCH} disappeared during the batch "
                                     "(expire_snapshots ran on the table while it was written?); nothing was "
                                     "published: run the batch again")
    return snap


def publish(jtable: Any, properties: dict[str, str], ledger: bool, table: str = "",
            retention: LedgerRetention | None = None) -> int:
    """Fast-forward ``main`` to the staged batch and record it in table properties: one metadata commit.
    The staging branch stays where it is (at ``main``'s new snapshot), ready for the next batch.
    Returns the published snapshot id."""
    staged = int(_branch_head(jtable, table or str(jtable.name())).snapshotId())
    txn = jtable.newTransaction()
    txn.manageSnapshots().fastForwardBranch("main", STAGING_BRANCH).commit()
    update = txn.updateProperties().set(LAST_BATCH_PROPERTY,
                                        json.dumps({**properties, TARGET_SNAPSHOT_KEY: str(staged)}, sort_keys=True))
    if ledger:
        changes = ledger_changes(table_properties(jtable), properties, LEDGER_CHUNK_ENTRIES, retention)
        for key, value in changes.updates.items():
            update = update.set(key, value)
        for key in changes.removals:
            update = update.remove(key)
    update.commit()
    txn.commitTransaction()
    return staged
