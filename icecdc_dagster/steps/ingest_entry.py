"""An ``ingest:`` entry as the engine sees it (no Dagster): settings, landing files as keys, stream batches.

A partition key is a landing file's name; a run of consecutive keys is one batch (at most
``files_per_batch`` files). A file that the targets' ledger already records as part of a batch is
always ingested again as exactly that batch (same files, same batch id), whatever keys the run
covers: re-executing one partition of a two-file batch, or retrying a failed key alone after a
partial commit, is then a no-op or completes the batch, and never writes a file twice.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from icecdc_dagster.config import IngestConfig
from icecdc_dagster.errors import IngestError
from icecdc_dagster.ingest import IngestResult, IngestSettings, landing, recorded_batches, routing
from icecdc_dagster.inputs.base import Lag, StreamBatch, StreamInput
from icecdc_dagster.inputs.registry import open_input


def ingest_settings(entry: IngestConfig) -> IngestSettings:
    return IngestSettings(landing=entry.source, target=entry.target,
                          identifier_columns=entry.identifier_columns, write_mode=entry.write_mode,
                          auto_create=entry.auto_create,
                          schema=entry.schema, schema_evolution=entry.schema_evolution,
                          files_per_batch=entry.landing_files_per_batch, max_file_age_s=entry.max_file_age_s,
                          take_expired_files=entry.takes_expired_files,
                          snapshot_deletes=entry.snapshot_deletes)


def fixed_target(entry: IngestConfig) -> str | None:
    """The one table an entry writes, or None for a routing template."""
    return None if routing.is_template(entry.target) else entry.target


def input_keys(entry: IngestConfig) -> list[str]:
    """The partition keys the entry's input offers now: landing file names, or for a stream input the
    first unacknowledged position when messages wait (the next batch starts there; its last position is
    known only once it is read, and is in the run's metadata and the Iceberg commit)."""
    stream = entry.input
    if stream is None:
        return landing_keys(entry)
    with open_input(stream) as reader:
        position = reader.next_position()
    return [] if position is None else [position]


def landing_keys(entry: IngestConfig) -> list[str]:
    """Names of the landing files, in name order (writers' hidden/``_`` files excluded)."""
    return [_name(f.uri) for f in landing.list_files(entry.landing_path)]


@dataclass(frozen=True)
class Batch:
    files: tuple[str, ...]      # landing file URIs, in ingestion order
    batch_id: str | None = None  # the recorded batch id, None for a new batch
    committed: bool = False      # recorded in every table it writes: nothing to do


def batches_for(entry: IngestConfig, keys: Sequence[str], recorded: Mapping[str, bool]) -> list[Batch]:
    """The engine batches of a run over partition keys (file names), in key order.

    ``recorded``: batch id -> fully committed (``ingest.recorded_batches``). A key whose
    file belongs to a recorded batch becomes that batch; consecutive other keys form one new batch.
    A landing file that is gone is matched by URI (an ingested file may have been cleaned up);
    a gone file that no batch records is an error.
    """
    by_part: dict[str, str] = {}
    by_uri: dict[str, str] = {}
    for bid, _complete in sorted(recorded.items(), key=lambda item: item[1]):  # complete ones win
        for part in bid.split(";"):
            by_part[part] = bid
            by_uri[part.rsplit("#", 1)[0]] = bid
    present = {_name(f.uri): f for f in landing.list_files(entry.landing_path)}
    known_uris = {_name(uri): uri for uri in by_uri}
    batches: list[Batch] = []
    fresh: list[str] = []
    done: set[str] = set()
    missing: list[str] = []
    for key in keys:
        file = present.get(key)
        recorded_id = by_part.get(file.batch_part) if file else by_uri.get(known_uris.get(key, ""))
        if recorded_id is None:
            if file is None:
                missing.append(key)
            else:
                fresh.append(file.uri)
            continue
        if fresh:
            batches.append(Batch(tuple(fresh)))
            fresh = []
        if recorded_id not in done:
            done.add(recorded_id)
            parts = tuple(p.rsplit("#", 1)[0] for p in recorded_id.split(";"))
            batches.append(Batch(parts, recorded_id, recorded[recorded_id]))
    if missing:
        raise IngestError(f"ingest {entry.name}: landing file(s) {missing} are no longer in {entry.landing_path}")
    if fresh:
        batches.append(Batch(tuple(fresh)))
    return batches


def _name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class StreamRun:
    """One bounded batch of a stream input: what was read, written and acknowledged."""

    result: IngestResult | None   # None: nothing new to write
    batch: StreamBatch
    lag_after: Lag

    @property
    def redelivered_skipped(self) -> int:
        return len(self.batch.already_committed)


def ingest_stream_batch(spark: Any, catalog_name: str, entry: IngestConfig, reader: StreamInput) -> StreamRun:
    """Read a bounded batch, commit it (its position range is the batch id in every commit), then acknowledge:
    the one contract of every input (``open_input(entry.any_input)``; landing files too).

    A crash after the commit leaves the batch unacknowledged: the broker delivers it again and the ledger
    skips it (acknowledged, not written); a batch committed to only some of its tables is rebuilt with the
    same range and completed."""
    settings = ingest_settings(entry)
    batch = reader.read(recorded_batches(spark, catalog_name, settings))
    result = None
    if batch.messages:
        result = reader.commit(spark, catalog_name, settings, batch)
    reader.acknowledge(batch)
    return StreamRun(result, batch, reader.lag())
