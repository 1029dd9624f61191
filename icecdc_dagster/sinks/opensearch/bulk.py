"""Bulk writes from Spark executors, with retries, summarised per partition.

Each Spark task streams its rows (id/action/version/JSON) into chunks (at most ``chunk_size``
actions and ``max_chunk_bytes`` bytes of NDJSON, rendered by :func:`actions.bulk_lines`: no
per-document dict or JSON encoding in opensearch-py's helpers) and sends up to ``parallelism``
chunks at a time, one bulk request each. Whole requests
that fail with a connection error, a timeout, 429 or 5xx, and items answered with 429/5xx, are
retried with exponential backoff. Every other item failure is counted (the first
``max_reported_failures`` reasons kept).

Rows reach the Python workers through ``mapInArrow`` (Arrow batches of
``spark.sql.execution.arrow.maxRecordsPerBatch`` rows, 10,000 by default: lower it for documents
of many KB), not ``rdd.mapPartitions``: the pickled-Row path converted every row to Java objects
and pickled them in the driver JVM (local mode: its executors), garbage that made the JVM's heap,
and so its peak RSS, grow with the batch's document count.

Memory stays flat in the document count: each task keeps at most ``parallelism`` chunks in flight
and returns ONE summary row (counts, a bounded list of reasons); the driver collects one row per
partition and adds them up (:func:`partition_summaries`).
"""

import json
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

from icecdc_dagster.errors import SinkUnavailableError
from icecdc_dagster.sinks.opensearch import actions as a
from icecdc_dagster.sinks.opensearch.documents import ACTION, ID, SOURCE, VERSION
from icecdc_dagster.sinks.opensearch.settings import OpenSearchSinkSettings

SUMMARY = "_os_summary"  # the one column of partition_summaries: a partition's WriteSummary as JSON


class BulkRequestFailedError(SinkUnavailableError):
    """A bulk request could not be delivered (after retries, or not retryable)."""


def _retryable(error: Exception) -> bool:
    from opensearchpy.exceptions import ConnectionError as OSConnectionError  # opensearch-py: ~1.2 s, its sink only
    from opensearchpy.exceptions import TransportError  # opensearch-py: ~1.2 s, its sink only

    if isinstance(error, OSConnectionError):  # includes timeouts
        return True
    return isinstance(error, TransportError) and error.status_code in a.RETRYABLE_STATUS


def backoff_s(settings: OpenSearchSinkSettings, attempt: int) -> float:
    return min(settings.max_backoff_s, settings.initial_backoff_s * (2 ** attempt))


Chunk = list[tuple[str, str]]  # (operation, NDJSON text) per action, see actions.bulk_lines


def send_chunk(client: Any, settings: OpenSearchSinkSettings, chunk: Chunk,
               bulk_kwargs: dict[str, Any]) -> a.WriteSummary:
    """Send one chunk (one bulk request) until every item has an answer; retry what may succeed later."""
    from opensearchpy.exceptions import TransportError  # opensearch-py: ~1.2 s, its sink only

    summary = a.WriteSummary()
    limit = settings.max_reported_failures
    pending, attempt = chunk, 0
    while pending:
        items: list[dict[str, Any]] = []
        error: Exception | None = None
        try:
            items = client.bulk(body="".join(text for _, text in pending), **bulk_kwargs)["items"]
        except TransportError as exc:
            if not _retryable(exc):
                raise BulkRequestFailedError(f"bulk request to index {settings.index} rejected: {exc}") from None
            error = exc
        retry_items: Chunk = []
        for act, item in zip(pending, items, strict=False):
            status = next(iter(item.values())).get("status", 500)
            outcome, info = a.classify(200 <= status < 300, item)
            if outcome == a.RETRY:
                retry_items.append(act)
                if attempt >= settings.max_retries:
                    summary.add_failure(a.failure_reason(act[0], info), limit)
            elif outcome == a.FAILED:
                summary.add_failure(a.failure_reason(act[0], info), limit)
            else:
                summary.counts[outcome] += 1
                if outcome == a.INDEXED:
                    summary.counts[a.indexed_as(info)] += 1
        unanswered = pending[len(items):]
        if not retry_items and not unanswered:
            break
        if attempt >= settings.max_retries:
            if unanswered:
                raise BulkRequestFailedError(
                    f"bulk request to index {settings.index} failed after {attempt + 1} attempts "
                    f"({len(unanswered)} actions unanswered): {error}")
            break
        time.sleep(backoff_s(settings, attempt))
        attempt += 1
        pending = retry_items + unanswered
    return summary


def _chunks(settings: OpenSearchSinkSettings, rows: Iterator[Any], summary: a.WriteSummary) -> Iterator[Chunk]:
    chunk: Chunk = []
    size = 0
    for doc_id, action, version, source in rows:
        summary.actions += 1
        try:
            op, text = a.bulk_lines(settings.index, doc_id, action, version, source)
        except ValueError as exc:
            summary.add_failure(str(exc), settings.max_reported_failures)
            continue
        length = len(text.encode()) if not text.isascii() else len(text)
        if chunk and size + length > settings.max_chunk_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append((op, text))
        size += length
        if len(chunk) >= settings.chunk_size:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def write_partition(settings: OpenSearchSinkSettings, rows: Iterator[Any]) -> Iterator[a.WriteSummary]:
    """mapPartitions body (runs in an executor): send this partition's actions, yield one summary."""
    summary = a.WriteSummary(partitions=1)
    bulk_kwargs: dict[str, Any] = {"request_timeout": settings.request_timeout_s}
    if settings.refresh == "wait_for":
        bulk_kwargs["refresh"] = "wait_for"
    client = settings.client()
    in_flight: deque[Future[Any]] = deque()

    def settle(future: Future[Any]) -> None:
        try:
            summary.merge(future.result(), settings.max_reported_failures)
        except Exception as exc:  # noqa: BLE001 - reported to the driver, which fails the batch
            summary.fatal.append(f"{type(exc).__name__}: {exc}")

    try:
        with ThreadPoolExecutor(max_workers=settings.parallelism) as pool:
            for chunk in _chunks(settings, rows, summary):
                while len(in_flight) >= settings.parallelism:
                    settle(in_flight.popleft())
                if summary.fatal:
                    break
                in_flight.append(pool.submit(send_chunk, client, settings, chunk, bulk_kwargs))
            while in_flight:
                settle(in_flight.popleft())
    except Exception as exc:  # noqa: BLE001
        summary.fatal.append(f"{type(exc).__name__}: {exc}")
    finally:
        client.close()
    yield summary


def _arrow_rows(batches: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
    """(id, action, version, source) per row, one Arrow batch in memory at a time."""
    for batch in batches:
        yield from zip(*(column.to_pylist() for column in batch.columns), strict=True)


def write_arrow_partition(settings: OpenSearchSinkSettings, batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow body: :func:`write_partition` over the Arrow batches, its summary as one JSON row."""
    for summary in write_partition(settings, _arrow_rows(batches)):
        yield pa.RecordBatch.from_pydict({SUMMARY: [json.dumps(summary.to_dict())]})


def partition_summaries(settings: OpenSearchSinkSettings, rows: DataFrame) -> DataFrame:
    """One row per partition of ``rows`` (lazy): computing it writes the partition's actions from the
    executor and yields its :class:`WriteSummary` as JSON. All the driver ever receives of a batch."""
    projected = rows.select(ID, ACTION, VERSION, SOURCE)
    return projected.mapInArrow(partial(write_arrow_partition, settings), f"{SUMMARY} string")


def write_bulk_rows(settings: OpenSearchSinkSettings, rows: DataFrame) -> a.WriteSummary:
    """Run the writes in the executors; only one small summary per partition comes back."""
    total = a.WriteSummary()
    for row in partition_summaries(settings, rows).collect():
        total.merge(a.WriteSummary.from_dict(json.loads(row[SUMMARY])), settings.max_reported_failures)
    return total
