"""The contract every sink implements; the Dagster layer only talks to this."""

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


class Sink(Protocol):
    name: str

    def read_checkpoint(self) -> Checkpoint | None:
        """The last applied source snapshot, read from the target itself."""

    def apply(self, batch: BatchInfo, events: Any) -> ApplyResult:
        """Apply ``events`` (a Spark DataFrame of CDC events) or skip/refuse per :func:`batch.decide`."""
