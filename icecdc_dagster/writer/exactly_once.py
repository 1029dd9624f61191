"""Exactly-once commits: the batch id lives in the snapshot summary, the write is staged on a branch.

A batch is written to a private staging branch first (data files + a snapshot that
``main`` does not see) and published by fast-forwarding ``main`` to it. A crash before
the publish leaves a dangling branch whose files are orphans once the next attempt
drops it; ``main`` never holds half a batch. The ledger is ``main``'s history: a batch
whose id is in an ancestor's summary is skipped.

Maintenance of the table itself (``rewrite_data_files`` + ``expire_snapshots``) removes those
summaries, so the publish also writes, in the SAME metadata commit (one Iceberg transaction:
fast-forward + property update), table properties that no expiry touches: the last batch's
summary properties (``icecdc.last-batch``: a replica's checkpoint) and, for ingest targets, the
ledger of every batch id (``icecdc.ledger``, compressed). Readers take the union of both.
"""

import base64
import json
import os
import signal
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

BATCH_ID_PROPERTY = "icecdc.batch-id"
LAST_BATCH_PROPERTY = "icecdc.last-batch"  # table property: JSON of the last published batch's summary properties
LEDGER_PROPERTY = "icecdc.ledger"          # table property: zlib+base64 JSON list of recorded batches' properties
TARGET_SNAPSHOT_KEY = "icecdc.target-snapshot-id"  # in LAST_BATCH_PROPERTY: the snapshot the batch published
STAGING_BRANCH = "icecdc_stage"
FAULT_ENV = "ICECDC_FAULT"
FAULT_KILL_BEFORE_PUBLISH = "kill-after-write-before-commit"
FAULT_TABLE_ENV = "ICECDC_FAULT_TABLE"  # only fault on tables whose name ends with this

T = TypeVar("T")


def java_table(spark: Any, table: str) -> Any:
    """The Iceberg Java ``Table`` of a Spark table name (fresh metadata, no cache)."""
    return spark._jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, table)


def main_ancestors(jtable: Any) -> Iterator[Any]:
    """Snapshots of ``main`` from the current one back to the first (Java objects)."""
    snap = jtable.currentSnapshot()
    while snap is not None:
        yield snap
        parent = snap.parentId()
        snap = jtable.snapshot(parent) if parent is not None else None


def committed_summaries(spark: Any, table: str) -> Iterator[tuple[int, int, dict[str, str]]]:
    """(snapshot id, sequence number, summary) of ``main``'s ancestors, newest first."""
    for snap in main_ancestors(java_table(spark, table)):
        yield int(snap.snapshotId()), int(snap.sequenceNumber()), dict(snap.summary())


def table_properties(jtable: Any) -> dict[str, str]:
    return dict(jtable.properties())


def decode_ledger(value: str | None) -> list[dict[str, str]]:
    if not value:
        return []
    return json.loads(zlib.decompress(base64.b64decode(value)).decode("utf-8"))


def encode_ledger(entries: list[dict[str, str]]) -> str:
    return base64.b64encode(zlib.compress(json.dumps(entries, separators=(",", ":")).encode("utf-8"), 9)).decode()


def last_batch(jtable: Any) -> dict[str, str] | None:
    """The summary properties of the last batch published to ``main`` (a table property: survives expiry)."""
    value = table_properties(jtable).get(LAST_BATCH_PROPERTY)
    return json.loads(value) if value else None


def recorded_summaries(spark: Any, table: str) -> Iterator[dict[str, str]]:
    """Summary properties of every batch the table records: ``main``'s newest ancestors, then the ledger
    property (oldest first), which survives compaction and snapshot expiry.

    The ledger is appended in the same commit that publishes a batch, so once the walk back from the
    current snapshot meets a batch the ledger holds, the ledger holds every older batch too: the walk
    stops there, and its cost is the few snapshots since the last batch, not the table's history
    (a table without a ledger is walked to its first snapshot)."""
    jtable = java_table(spark, table)
    ledger = decode_ledger(table_properties(jtable).get(LEDGER_PROPERTY))
    in_ledger = {entry[BATCH_ID_PROPERTY] for entry in ledger if BATCH_ID_PROPERTY in entry}
    for snap in main_ancestors(jtable):
        summary = dict(snap.summary())
        if summary.get(BATCH_ID_PROPERTY) in in_ledger:
            break
        yield summary
    yield from ledger


def committed_batch_ids(spark: Any, table: str) -> set[str]:
    return {s[BATCH_ID_PROPERTY] for s in recorded_summaries(spark, table) if BATCH_ID_PROPERTY in s}


def is_committed(spark: Any, table: str, batch_id: str, ledger: bool) -> bool:
    """Whether ``batch_id`` is in ``main``. A ledger table answers from its ledger (every batch);
    otherwise the newest batch on ``main`` decides: older batches are refused by the writer's own
    checkpoint (a replica applies in order), so the walk stops at the first batch it meets."""
    if ledger:
        return batch_id in committed_batch_ids(spark, table)
    for snap in main_ancestors(java_table(spark, table)):
        newest = dict(snap.summary()).get(BATCH_ID_PROPERTY)
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


def staged_commit(spark: Any, table: str, properties: dict[str, str], write: Callable[[str], T],
                  ledger: bool = False) -> tuple[T, int]:
    """Run ``write(branch_table_name)`` on a fresh staging branch, then publish it to ``main``.

    ``ledger``: also append the batch to the table's ledger property (ingest targets: every batch id
    must stay known after expiry). Returns the write's result and the published snapshot id.
    """
    jtable = java_table(spark, table)
    if jtable.refs().containsKey(STAGING_BRANCH):
        # A previous attempt died before publishing: its files become orphans.
        jtable.manageSnapshots().removeBranch(STAGING_BRANCH).commit()
        jtable.refresh()
    jtable.manageSnapshots().createBranch(STAGING_BRANCH).commit()
    jtable.refresh()
    staged_from = jtable.snapshot(STAGING_BRANCH).snapshotId()
    with commit_properties(spark, properties):
        result = write(f"{table}.branch_{STAGING_BRANCH}")
    jtable.refresh()
    if jtable.snapshot(STAGING_BRANCH).snapshotId() == staged_from:
        # Nothing to write (all events dead-lettered, cancelled or tombstones): still record the batch.
        append = jtable.newAppend().toBranch(STAGING_BRANCH)
        for key, value in properties.items():
            append = append.set(key, str(value))
        append.commit()
    if os.environ.get(FAULT_ENV) == FAULT_KILL_BEFORE_PUBLISH and table.endswith(os.environ.get(FAULT_TABLE_ENV, "")):
        # Test hook: die with the batch's files written and its snapshot staged, before main sees it.
        os.kill(os.getpid(), signal.SIGKILL)
    jtable.refresh()
    publish(jtable, {k: str(v) for k, v in properties.items()}, ledger)
    jtable.refresh()
    return result, int(jtable.currentSnapshot().snapshotId())


def publish(jtable: Any, properties: dict[str, str], ledger: bool) -> None:
    """Fast-forward ``main`` to the staged batch and record it in table properties: one metadata commit."""
    staged = int(jtable.snapshot(STAGING_BRANCH).snapshotId())
    txn = jtable.newTransaction()
    txn.manageSnapshots().fastForwardBranch("main", STAGING_BRANCH).removeBranch(STAGING_BRANCH).commit()
    update = txn.updateProperties().set(LAST_BATCH_PROPERTY,
                                        json.dumps({**properties, TARGET_SNAPSHOT_KEY: str(staged)}, sort_keys=True))
    if ledger:
        entries = decode_ledger(table_properties(jtable).get(LEDGER_PROPERTY))
        entries.append(properties)
        update = update.set(LEDGER_PROPERTY, encode_ledger(entries))
    update.commit()
    txn.commitTransaction()
