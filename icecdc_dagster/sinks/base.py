"""The contract every sink implements; the Dagster layer only talks to this."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from icecdc_dagster.batch import BatchInfo, Checkpoint


@dataclass(frozen=True)
class ApplyResult:
    """What applying one batch did; ``skipped`` when the sink had it already."""

    sink_name: str
    skipped: bool
    checkpoint: Checkpoint | None
    counts: dict[str, int] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    # The batch's events per change type, when the sink counted them while its write read them (no job of
    # their own); None: the caller counts them.
    event_counts: dict[str, int] | None = None


@dataclass(frozen=True)
class Disagreement:
    """One of a sink's exact outcome counts that differs from what the batch's events imply.

    ``count``: the sink's own count (a key of :attr:`ApplyResult.counts`, e.g. ``inserted``);
    ``change_types``: the events it must equal, summed (none: it must be 0); ``cause``: what makes them
    differ, in words a person can act on.
    """

    count: str
    change_types: tuple[str, ...]
    expected: int
    found: int
    cause: str

    @property
    def difference(self) -> int:
        return self.found - self.expected


# One rule of a sink's agreement: (its count, the change types that count equals, the cause when it found
# fewer, the cause when it found more).
CountRule = tuple[str, tuple[str, ...], str, str]


def count_disagreements(rules: Sequence[CountRule], event_counts: Mapping[str, int],
                        counts: Mapping[str, int]) -> list[Disagreement]:
    """The sink's ``counts`` that differ from what the batch's ``event_counts`` imply, rule by rule (a count
    the sink did not report is 0): the one comparison every sink kind's ``disagreements`` makes with rules of
    its own."""
    found = []
    for count, change_types, fewer, more in rules:
        expected = sum(int(event_counts.get(t, 0)) for t in change_types)
        actual = int(counts.get(count, 0))
        if actual != expected:
            found.append(Disagreement(count, change_types, expected, actual, fewer if actual < expected else more))
    return found


# The events' min and max per column, as far as the stored batch's file statistics tell (None: they cannot):
# asked by a sink that bounds its write by its key range, for its own key columns.
ColumnRanges = Callable[[Sequence[str]], "dict[str, tuple[Any, Any]] | None"]


class Sink(Protocol):
    name: str

    def read_checkpoint(self) -> Checkpoint | None:
        """The last applied source snapshot, read from the target itself (None: nothing applied yet).

        Raises:
            CheckpointError: the target's record of it is unreadable or ambiguous (an alias on two indexes).
            Exception: the target's own client error when it cannot be read (each kind names its own).
        """

    def apply(self, batch: BatchInfo, events: Any, ranges: ColumnRanges | None = None) -> ApplyResult:
        """Apply ``events`` (a Spark DataFrame of CDC events as :func:`icecdc_dagster.changelog.to_events` makes
        them: at most one per document id, a key's last change) or skip/refuse per :func:`batch.decide`.
        ``ranges``: the events' column ranges when the caller can read them without a job (stored events).

        Whatever it raises, the checkpoint is not advanced: running the batch again is safe.

        Raises:
            CheckpointError: the batch does not follow the checkpoint (a gap, an older batch, another
                line), or the checkpoint moved while the batch was written.
            SinkWriteError: the target rejected part of the batch; the subclasses say why -
                :class:`SchemaChangeError` (a schema change it cannot follow in place),
                :class:`ReindexError` (a new index version cannot be built or swapped in),
                :class:`SinkUnavailableError` (the service did not answer: transient).
            Exception: the target's own client error on a request the sink does not wrap (each kind
                names its own).
        """

    def disagreements(self, batch: BatchInfo, event_counts: Mapping[str, int],
                      result: ApplyResult) -> list[Disagreement]:
        """Where ``result``'s exact counts contradict the batch's events per change type
        (``event_counts``), for a batch this sink applied; empty when they agree or cannot be compared
        exactly (each kind says which batches it compares, and why).

        Raises:
            Nothing of its own: it compares counts in memory (a kind may read its target and let its
                client's errors pass).
        """
