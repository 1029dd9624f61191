"""Bulk writes from Spark executors, with retries, summarised per partition.

Each Spark task streams its rows (id/action/version/JSON, via ``rdd.mapPartitions``:
``mapInArrow`` would need pandas on the executors)
into chunks and sends up to ``parallelism`` chunks at a time through
``opensearchpy.helpers.streaming_bulk``. Whole requests that fail with a
connection error, a timeout, 429 or 5xx, and items answered with 429/5xx,
are retried with exponential backoff. Every other item failure is collected.
Each task returns one summary row; the driver adds them up and decides.
"""

import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

from pyspark.sql import DataFrame

from icecdc_dagster.errors import SinkUnavailableError
from icecdc_dagster.sinks.opensearch import actions as a
from icecdc_dagster.sinks.opensearch.documents import ACTION, ID, SOURCE, VERSION
from icecdc_dagster.sinks.opensearch.settings import OpenSearchSinkSettings

ACTION_OVERHEAD_BYTES = 128


class BulkRequestFailedError(SinkUnavailableError):
    """A bulk request could not be delivered (after retries, or not retryable)."""


def _retryable(error: Exception) -> bool:
    from opensearchpy.exceptions import ConnectionError as OSConnectionError
    from opensearchpy.exceptions import TransportError

    if isinstance(error, OSConnectionError):  # includes timeouts
        return True
    return isinstance(error, TransportError) and error.status_code in a.RETRYABLE_STATUS


def backoff_s(settings: OpenSearchSinkSettings, attempt: int) -> float:
    return min(settings.max_backoff_s, settings.initial_backoff_s * (2 ** attempt))


def send_chunk(client: Any, settings: OpenSearchSinkSettings, chunk: list[dict[str, Any]],
               bulk_kwargs: dict[str, Any]) -> a.WriteSummary:
    """Send one chunk until every item has an answer; retry what may succeed later."""
    from opensearchpy import helpers
    from opensearchpy.exceptions import TransportError

    summary = a.WriteSummary()
    limit = settings.max_reported_failures
    pending, attempt = chunk, 0
    while pending:
        results: list[tuple[bool, dict[str, Any]]] = []
        error: Exception | None = None
        try:
            for result in helpers.streaming_bulk(
                    client, pending, chunk_size=len(pending), max_chunk_bytes=settings.max_chunk_bytes,
                    raise_on_error=False, raise_on_exception=True, max_retries=0, yield_ok=True, **bulk_kwargs):
                results.append(result)
        except TransportError as exc:
            if not _retryable(exc):
                raise BulkRequestFailedError(f"bulk request to index {settings.index} rejected: {exc}") from None
            error = exc
        retry_items: list[tuple[dict[str, Any], dict[str, Any]]] = []
        for act, (ok, item) in zip(pending, results, strict=False):
            outcome, info = a.classify(ok, item)
            if outcome == a.RETRY:
                retry_items.append((act, info))
            elif outcome == a.FAILED:
                summary.add_failure(a.failure_reason(act["_op_type"], info), limit)
            else:
                summary.counts[outcome] += 1
        unanswered = pending[len(results):]
        if not retry_items and not unanswered:
            break
        if attempt >= settings.max_retries:
            if unanswered:
                raise BulkRequestFailedError(
                    f"bulk request to index {settings.index} failed after {attempt + 1} attempts "
                    f"({len(unanswered)} actions unanswered): {error}")
            for act, info in retry_items:
                summary.add_failure(a.failure_reason(act["_op_type"], info), limit)
            break
        time.sleep(backoff_s(settings, attempt))
        attempt += 1
        pending = [act for act, _ in retry_items] + unanswered
    return summary


def _chunks(settings: OpenSearchSinkSettings, rows: Iterator[Any],
            summary: a.WriteSummary) -> Iterator[list[dict[str, Any]]]:
    chunk: list[dict[str, Any]] = []
    size = 0
    for doc_id, action, version, source in rows:
        summary.actions += 1
        try:
            act = a.bulk_action(settings.index, doc_id, action, version, source)
        except ValueError as exc:
            summary.add_failure(str(exc), settings.max_reported_failures)
            continue
        chunk.append(act)
        size += ACTION_OVERHEAD_BYTES + (len(source) if source else 0)
        if len(chunk) >= settings.chunk_size or size >= settings.max_chunk_bytes:
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


def write_bulk_rows(settings: OpenSearchSinkSettings, rows: DataFrame) -> a.WriteSummary:
    """Run the writes in the executors; only one small summary per partition comes back."""
    total = a.WriteSummary()
    projected = rows.select(ID, ACTION, VERSION, SOURCE)
    for summary in projected.rdd.mapPartitions(partial(write_partition, settings)).collect():
        total.merge(summary, settings.max_reported_failures)
    return total
