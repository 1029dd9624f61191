"""The input contract: read a bounded batch, commit it, acknowledge it (no Dagster).

A stream input reads messages in source-position order (a JetStream stream sequence, a Redis entry id).
The batch id written in the Iceberg commit is ``<source>#<first>..<last>``: the ledger. Before it builds a
batch, a reader drops the messages the ledger already holds (a crash between commit and acknowledgement
re-delivers them: they are acknowledged, never written again) and, when the ledger holds a batch that only
some of its tables committed, rebuilds exactly that batch (same range, same id) so the commit completes.
Acknowledgement always follows the commit.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import Field

from icecdc_dagster.errors import StreamInputError
from icecdc_dagster.fields import Model, PositiveInt
from icecdc_dagster.ingest import IngestResult, IngestSettings, ingest_records

RANGE_SEPARATOR = ".."


@dataclass(frozen=True)
class Message:
    """One broker message: its source position (as the broker writes it), its bytes, and the broker's handle."""

    position: str
    data: bytes
    handle: Any = None  # what acknowledging needs (a JetStream message, a Redis entry id)


@dataclass(frozen=True)
class StreamBatch:
    """A bounded batch: the messages to write (position order) and the re-deliveries the ledger already holds."""

    source: str
    messages: tuple[Message, ...]
    already_committed: tuple[Message, ...] = ()
    recorded_id: str | None = None  # the ledger's id when the batch completes a partially committed one

    @property
    def batch_id(self) -> str | None:
        if self.recorded_id is not None:
            return self.recorded_id
        if not self.messages:
            return None
        return f"{self.source}#{self.messages[0].position}{RANGE_SEPARATOR}{self.messages[-1].position}"

    @property
    def first(self) -> str | None:
        return self.messages[0].position if self.messages else None

    @property
    def last(self) -> str | None:
        return self.messages[-1].position if self.messages else None


@dataclass(frozen=True)
class Lag:
    """Messages waiting for this input: not yet delivered, and delivered but not acknowledged."""

    pending: int
    unacknowledged: int = 0
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def waiting(self) -> int:
        return self.pending + self.unacknowledged


@dataclass(frozen=True)
class LedgerView:
    """What the targets' ledger says about one source: the last committed position and a partial batch."""

    committed_through: Any = None          # position key of the newest fully committed batch's last message
    partial: tuple[Any, Any, str] | None = None  # (first key, last key, batch id) of a batch committed to some tables


def ledger_view(source: str, recorded: Mapping[str, bool], position_key: Callable[[str], Any]) -> LedgerView:
    """Parse the batch ids of ``source`` in ``recorded`` (batch id -> committed to every table it writes)."""
    through = None
    partial = None
    for bid, complete in recorded.items():
        prefix, _, span = bid.rpartition("#")
        if prefix != source or RANGE_SEPARATOR not in span:
            continue
        first, last = (position_key(p) for p in span.split(RANGE_SEPARATOR, 1))
        if complete:
            through = last if through is None or last > through else through
        elif partial is None or first < partial[0]:
            partial = (first, last, bid)
    if partial is not None and through is not None and partial[1] <= through:
        partial = None  # an older batch's leftover: a newer complete one covers it
    return LedgerView(through, partial)


def split_batch(source: str, fetched: Sequence[Message], view: LedgerView,
                position_key: Callable[[str], Any]) -> StreamBatch:
    """The batch of ``fetched`` (position order): re-deliveries at or before the ledger's position are only
    acknowledged; a partially committed batch is rebuilt exactly; otherwise every newer message."""
    through = view.committed_through
    done = [m for m in fetched if through is not None and position_key(m.position) <= through]
    rest = fetched[len(done):]  # position order: the committed ones come first
    if view.partial is None:
        return StreamBatch(source, tuple(rest), tuple(done))
    first, last, bid = view.partial
    batch = [m for m in rest if first <= position_key(m.position) <= last]
    if not batch or position_key(batch[-1].position) != last or position_key(batch[0].position) != first:
        raise StreamInputError(f"{source}: the batch {bid} is committed to only some of its tables, and the broker "
                               f"no longer delivers its messages {view.partial[0]}..{view.partial[1]} (read "
                               f"{[m.position for m in rest[:3]]}...): re-publish them or drop the partial commit")
    return StreamBatch(source, tuple(batch), tuple(done), bid)


class StreamInput(ABC):
    """An open connection to one stream input. Used as: ``read`` -> commit the batch -> ``acknowledge``."""

    @property
    @abstractmethod
    def source(self) -> str:
        """The ledger's name of this input (stable across hosts and consumer names)."""

    @abstractmethod
    def position_key(self, position: str) -> Any:
        """A sortable key of a position (positions order the messages exactly as the broker does).

        Raises:
            Nothing of its own: positions come from this input's own reads.
        """

    @abstractmethod
    def read(self, recorded: Mapping[str, bool]) -> StreamBatch:
        """The next bounded batch, given the ledger (``recorded``: batch id -> fully committed).

        Raises:
            StreamInputError: the broker cannot deliver a batch as asked (names the input: a stream or
                consumer missing, entries held by another consumer).
            Exception: the client's own connection errors when the broker does not answer (transient).
        """

    def commit(self, spark: Any, catalog_name: str, settings: "IngestSettings", batch: StreamBatch) -> "IngestResult":
        """Write the batch to its targets exactly once (its id in every commit): messages take a landing
        line's path (``ingest.ingester.ingest_records``).

        Raises:
            IngestError: as :func:`ingest.ingest_records` (a subclass names why: a target missing, a schema
                that cannot be declared or coerced); nothing was acknowledged.
            pyspark.errors.AnalysisException, py4j.protocol.Py4JJavaError: Spark or Iceberg refused a write
                (passes through).
        """
        bid = batch.batch_id
        assert bid is not None, "a batch with messages has an id"
        return ingest_records(spark, catalog_name, settings, bid, [(m.position, m.data) for m in batch.messages])

    @abstractmethod
    def acknowledge(self, batch: StreamBatch) -> None:
        """Tell the broker the batch (and its re-deliveries) is committed: called only after the commit.

        Raises:
            StreamInputError: the broker did not take the acknowledgement (the client's own connection
                errors pass through as they are); the batch is committed, a re-delivery is skipped by the ledger.
        """

    @abstractmethod
    def lag(self) -> Lag:
        """Messages waiting (cheap: broker metadata only).

        Raises:
            StreamInputError: the broker cannot be asked (the client's own connection errors pass through).
        """

    @abstractmethod
    def next_position(self) -> str | None:
        """The first unacknowledged position (the next batch starts there or after), from broker metadata
        only; None when nothing waits. The sensor names the next batch's partition by it.

        Raises:
            StreamInputError: the broker cannot be asked (the client's own connection errors pass through).
        """

    def close(self) -> None:  # noqa: B027 - optional
        """Release the connection.

        Raises:
            Nothing of its own: an input never connected closes nothing; the client's own errors on
                closing pass through.
        """

    def __enter__(self) -> "StreamInput":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InputConfig(Model):
    """One ``input:`` block of an ``ingest:`` entry (``input: {<kind>: {settings}}``)."""

    kind: ClassVar[str]

    @property
    def source(self) -> str:
        """The ledger's name of the input (``LANDING_PROPERTY`` of every commit)."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


class BrokerInputConfig(InputConfig):
    """An input read from a broker (messages, acknowledged after the commit)."""

    max_messages: PositiveInt = Field(default=10000, description="messages per batch at most (one commit per target)")

