"""Row counts per change type measured while a batch is written, instead of an aggregation job after it.

Spark's ``Dataset.observe`` adds a metrics node to the written plan: the counts are accumulated by
the write's own tasks (only successful task attempts count) and handed to the driver when the query
ends. One Spark job less per count, and the rows are not read again.

The metrics arrive through Spark's listener bus, after the action returns; :meth:`ObservedCounts.get`
waits for them a bounded time and gives None when they do not come (then the caller counts with an
aggregation, as before). Each observation has its own name: several runs write at once in one
SparkSession (warm launcher lanes), and a name is how Spark tells their metrics apart.
"""

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import Observation
from pyspark.sql import functions as F

from icecdc_dagster.batch import CHANGE_TYPE, CHANGE_TYPES
from icecdc_dagster.column_names import quote
from icecdc_dagster.runtime.java import java_map

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

WAIT_S = 30.0


@dataclass
class ObservedCounts:
    observation: Any  # pyspark.sql.Observation

    def get(self, wait_s: float = WAIT_S) -> dict[str, int] | None:
        """Rows per change type (types without rows left out), or None when Spark reported nothing
        within ``wait_s`` (e.g. the write failed, or the plan dropped the metrics node)."""
        handle = getattr(self.observation, "_jo", None)
        if handle is None:
            return None
        future = handle.future()
        deadline = time.monotonic() + wait_s
        delay = 0.002
        while not future.isCompleted():
            if time.monotonic() >= deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        values = java_map(handle.getAsJava())  # Observation.get iterates the map: 2 round trips per entry
        return {change_type: int(values.get(_alias(change_type)) or 0) for change_type in CHANGE_TYPES
                if int(values.get(_alias(change_type)) or 0)}


def _alias(change_type: str) -> str:
    return f"n_{change_type.lower()}"


def observe_change_counts(rows: "DataFrame") -> tuple["DataFrame", ObservedCounts]:
    """``rows`` with a metrics node counting rows per ``_change_type``: write the returned frame."""
    observation = Observation(f"icecdc_counts_{uuid.uuid4().hex}")
    # SQL text: one py4j round trip per aggregate instead of one per function and operator.
    exprs = [F.expr(f"count_if({quote(CHANGE_TYPE)} = '{t}') AS {_alias(t)}") for t in CHANGE_TYPES]
    return rows.observe(observation, *exprs), ObservedCounts(observation)
