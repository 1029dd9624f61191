"""``MergeTally.java`` (next to this file): a MERGE clause condition that counts the rows its clause takes.

Compiled on first use (:mod:`javac`) and loaded into the session like the equality-delete writer, one
instance per session registered as :data:`FUNCTION`. A :class:`Tallies` opens two counters for one MERGE
(the rows its delete clause takes, the rows its update clause takes), each under its own tag. Where the class
cannot be built (no JDK's ``javac``), :func:`tallies` says so with ``None`` and the caller counts another way.
"""

import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from icecdc_dagster.errors import RuntimeSetupError
from icecdc_dagster.runtime import jars as jarlib
from icecdc_dagster.runtime.java import JavaObject, gateway, jvm
from icecdc_dagster.runtime.javac import classes_jar, compiled_classes, pyspark_jars, session_class

SOURCE = Path(__file__).with_name("MergeTally.java")
CLASS_NAME = "icecdc.tally.MergeTally"
FUNCTION = "icecdc_merge_tally"
_LOCK = threading.Lock()
_LOADED: dict[str, JavaObject | None] = {}  # SparkContext application id -> the instance (None: cannot be built)


@dataclass(frozen=True)
class Tallies:
    """Two counters opened for one MERGE: SQL conditions for its delete and update clauses, and their counts."""

    tag: str
    _tally: JavaObject
    _counters: tuple[JavaObject, JavaObject]

    def condition(self, clause: str, column: str) -> str:
        """The SQL condition that counts the rows ``clause`` (``deleted`` or ``updated``) takes; ``column``:
        any column of the MERGE's source, as SQL."""
        return f"{FUNCTION}({column}, '{self.tag}-{clause}')"

    def counts(self) -> tuple[int, int]:
        """(rows the delete clause took, rows the update clause took), once the MERGE has run."""
        return int(self._counters[0].value()), int(self._counters[1].value())

    def close(self) -> None:
        """Stop counting under this MERGE's tags (later tasks no longer carry its counters)."""
        for clause in ("deleted", "updated"):
            self._tally.close(f"{self.tag}-{clause}")


def tallies(spark: Any) -> Tallies | None:
    """Two fresh counters for one MERGE, or None where the class cannot be built here.

    Raises:
        py4j.protocol.Py4JJavaError: the session refused the function's registration.
    """
    tally = _session_tally(spark)
    if tally is None:
        return None
    tag = uuid.uuid4().hex
    counters = []
    for clause in ("deleted", "updated"):
        counter = spark.sparkContext._jsc.sc().longAccumulator(f"icecdc_{clause}_{tag}")  # noqa: SLF001
        tally.open(f"{tag}-{clause}", counter)
        counters.append(counter)
    return Tallies(tag, tally, (counters[0], counters[1]))


def _session_tally(spark: Any) -> JavaObject | None:
    app = str(spark.sparkContext.applicationId)
    with _LOCK:
        if app not in _LOADED:
            _LOADED[app] = _register(spark)
        return _LOADED[app]


def _register(spark: Any) -> JavaObject | None:
    try:
        jar = _jar()
    except RuntimeSetupError:
        return None  # no javac here: MERGEs count by their source's presence join instead
    view, java = jvm(spark), gateway(spark)
    tally_class = session_class(spark, jar, CLASS_NAME)
    tally = tally_class.getDeclaredConstructor(java.new_array(view.java.lang.Class, 0)).newInstance(
        java.new_array(view.java.lang.Object, 0))
    spark._jsparkSession.udf().register(FUNCTION, tally, view.org.apache.spark.sql.types.DataTypes.BooleanType)  # noqa: SLF001
    return tally


def _jar() -> Path:
    return classes_jar(compiled_classes(SOURCE, [jarlib.iceberg_runtime_jar(), *pyspark_jars()], "merge-tally",
                                        "icecdc/tally/MergeTally.class"))
