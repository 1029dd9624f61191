"""Landing files as an input: read a bounded batch of files, commit it, acknowledge (nothing to tell a file).

The ledger decides what waits: a file is done when a fully committed batch holds it; a batch that only
some of its tables committed is rebuilt exactly (same files, same id) before anything newer, as the
landing asset does with partition keys (``steps.ingest_entry.batches_for``). Files past the ledger's
horizon are set aside by the commit (``ingest.horizon``).
"""

from collections.abc import Mapping
from typing import Any

from icecdc_dagster.ingest import IngestResult, IngestSettings, ingest_files, landing
from icecdc_dagster.inputs.base import Lag, Message, StreamBatch, StreamInput
from icecdc_dagster.inputs.landing.config import LandingConfig


class LandingInput(StreamInput):
    def __init__(self, config: LandingConfig) -> None:
        self.config = config
        self._waiting: list[landing.LandingFile] | None = None  # after the last read: files still waiting

    @property
    def source(self) -> str:
        return self.config.path

    def position_key(self, position: str) -> str:
        return position.rstrip("/").rsplit("/", 1)[-1]  # files are read in name order

    def read(self, recorded: Mapping[str, bool]) -> StreamBatch:
        listed = landing.list_files(self.config.path)
        by_part = {f.batch_part: f for f in listed}
        done = {part for bid, complete in recorded.items() if complete for part in bid.split(";")}
        for bid, complete in sorted(recorded.items()):
            parts = bid.split(";")
            if not complete and all(p in by_part for p in parts) and not all(p in done for p in parts):
                batch = [by_part[p] for p in parts]  # complete the partial batch first, exactly as recorded
                break
        else:
            recorded_parts = {part for bid in recorded for part in bid.split(";")}
            fresh = [f for f in listed if f.batch_part not in recorded_parts]
            batch = fresh[: self.config.files_per_batch]
        self._waiting = [f for f in listed if f.batch_part not in done and f not in batch]
        messages = tuple(Message(f.uri, b"", f) for f in batch)
        return StreamBatch(self.source, messages, (), landing.batch_id(batch) if batch else None)

    def commit(self, spark: Any, catalog_name: str, settings: "IngestSettings", batch: StreamBatch) -> "IngestResult":
        """Ingest the batch's files as they are (a landing line's own path).

        Raises:
            IngestError: as :func:`ingest.ingest_files`; besides the contract's, a subclass
                :class:`HiddenLandingFileError` for a file named like a writer in progress.
        """
        return ingest_files(spark, catalog_name, None, settings, [m.position for m in batch.messages])

    def acknowledge(self, batch: StreamBatch) -> None:
        """Files are immutable and the ledger skips what is committed: nothing to tell."""

    def lag(self) -> Lag:
        waiting = self._waiting if self._waiting is not None else landing.list_files(self.config.path)
        return Lag(len(waiting), 0, {"files": len(waiting)})

    def next_position(self) -> str | None:
        waiting = self._waiting if self._waiting is not None else landing.list_files(self.config.path)
        return self.position_key(waiting[0].uri) if waiting else None
