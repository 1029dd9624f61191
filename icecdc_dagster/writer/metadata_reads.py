"""The exactly-once records read from table metadata by pyiceberg, without Spark.

``icecdc status`` must answer in a second or two; a SparkSession costs 5-10 s to start. Checkpoints and
ledgers are snapshot summaries and table properties, which the catalog serves as metadata: these are the
readers of :mod:`exactly_once` over a pyiceberg ``Table`` (the same rules, through ``recorded_in`` and
``last_batch_in``). Runs keep reading through Spark, whose catalog they write with.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING

from pyiceberg.table.snapshots import ancestors_of

from icecdc_dagster.writer.exactly_once import recorded_in

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot


def summary_of(snapshot: "Snapshot") -> dict[str, str]:
    """A snapshot's summary properties (without the operation, as Spark's summary map has them)."""
    return dict(snapshot.summary.additional_properties) if snapshot.summary is not None else {}


def main_snapshots(table: "Table") -> Iterator["Snapshot"]:
    """Snapshots of ``main`` from the current one back to the first."""
    return iter(ancestors_of(table.current_snapshot(), table.metadata))


def recorded_in_metadata(table: "Table") -> Iterator[dict[str, str]]:
    """``exactly_once.recorded_summaries`` of a pyiceberg table: the summaries since the ledger, then the ledger."""
    return recorded_in(dict(table.properties), (summary_of(s) for s in main_snapshots(table)))
