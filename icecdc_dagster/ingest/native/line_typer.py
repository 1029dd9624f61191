"""``LineTyper.java`` (next to this file): a plain line typed in one pass of a streaming JSON parser.

Compiled on first use (:mod:`icecdc_dagster.runtime.javac`), one instance per application and target columns
(:func:`typer`), which maps a batch's lines to its typed rows in the JVM (:func:`typed_rows`). Where the class
cannot be built (no JDK's ``javac``), :func:`typer` says so with ``None`` and the caller types with Spark
expressions.
"""

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import types as T

from icecdc_dagster.errors import RuntimeSetupError
from icecdc_dagster.ingest.coercion import IGNORED_FIELDS
from icecdc_dagster.ingest.native.column_rules import TargetColumn
from icecdc_dagster.runtime.java import JavaObject, gateway, jvm
from icecdc_dagster.runtime.javac import classes_jar, compiled_classes, pyspark_jars, session_class

SOURCE = Path(__file__).with_name("LineTyper.java")
CLASS_NAME = "icecdc.typing.LineTyper"
# LineTyper's column kinds; any other type is OTHER (a present value routes the line).
_KINDS: tuple[tuple[type[T.DataType], int], ...] = (
    (T.StringType, 0), (T.LongType, 1), (T.IntegerType, 2), (T.BooleanType, 3), (T.DoubleType, 4),
    (T.DecimalType, 5), (T.DateType, 6), (T.TimestampType, 7), (T.TimestampNTZType, 8), (T.BinaryType, 9))
_OTHER = 10
# LineTyper.tally's slots, in its order, by the names of the batch's figures (events_read: lines typed whole;
# routed: lines left to the Python rules; extra_set: lines with a value in their first extra column).
TALLY_SLOTS = ("events_read", "tombstones", "dead_lettered", IGNORED_FIELDS, "routed", "extra_set")
# Key types whose range the tally keeps (those the typer types itself; a MERGE's bounds take these and shorter
# integers, whose lines the typer leaves to the Python rules).
_RANGED = (T.LongType, T.IntegerType, T.StringType, T.DateType)
_EPOCH = date(1970, 1, 1)
_LOCK = threading.Lock()
_TYPERS: dict[tuple[str, str], JavaObject | None] = {}  # (application, target) -> its typer (None: no javac)
_CLASSES: dict[str, JavaObject | None] = {}  # application id -> the class loaded in its session (None: no javac)


def typer(spark: Any, columns: Sequence[TargetColumn], keys: Sequence[str], known: Sequence[str]
          ) -> JavaObject | None:
    """The ``LineTyper`` of these target columns (one per application and target), or None where the class
    cannot be built (no JDK's ``javac``)."""
    spec = repr(([(c.name, c.dtype.json()) for c in columns], sorted(keys), sorted(known)))
    target = hashlib.sha1(spec.encode()).hexdigest()[:16]
    app = str(spark.sparkContext.applicationId)
    with _LOCK:
        if (app, target) not in _TYPERS:
            if app not in _CLASSES:
                _CLASSES[app] = _load(spark)
            typer_class = _CLASSES[app]
            _TYPERS[(app, target)] = None if typer_class is None else _instance(spark, typer_class, columns, keys,
                                                                                 known)
        return _TYPERS[(app, target)]


@dataclass(frozen=True)
class LineTally:
    """What the typer counted while it made a batch's rows (``LineTyper.Tally``: Spark accumulators): the batch's
    figures and its key range with no aggregate in its plan. The counts grow with each computation of the rows
    (a caller takes differences); the ranges do not change."""

    java: JavaObject
    ranged: tuple[TargetColumn, ...]  # the key columns whose range it keeps

    def figures(self) -> dict[str, int]:
        """The counts by :data:`TALLY_SLOTS`' names."""
        return dict(zip(TALLY_SLOTS, (int(v) for v in self.java.counts()), strict=True))

    def ranges(self) -> dict[str, tuple[Any, Any]]:
        """Each ranged column's (min, max) over the rows typed whole, as Spark's ``min``/``max`` give them; a
        column none of them holds a value of is left out."""
        values = list(self.java.ranges())
        out: dict[str, tuple[Any, Any]] = {}
        for j, c in enumerate(self.ranged):
            lo, hi = values[2 * j], values[2 * j + 1]
            if lo is not None:
                out[c.name] = (_EPOCH + timedelta(days=int(lo)), _EPOCH + timedelta(days=int(hi))) if isinstance(
                    c.dtype, T.DateType) else (lo, hi)
        return out


def typed_rows(lines: DataFrame, typer: JavaObject, columns: Sequence[TargetColumn], keys: Sequence[str],
               out: T.StructType, order_shift: int, words: Sequence[str]) -> tuple[DataFrame, LineTally]:
    """``lines`` (file_index, source_file, source_offset, raw, extra...) typed by ``typer`` (of ``columns``) into
    ``out``'s rows (``LineTyper.typedRows``: one scan of the lines mapped in the JVM, no expression per column),
    and the tally the mapping counts them into (with the range of each key column of a type Spark orders).

    Raises:
        py4j.protocol.Py4JJavaError: Spark refused the plan (``out`` does not match what the typer writes).
    """
    spark = lines.sparkSession
    view, java = jvm(spark), gateway(spark)
    ranged = [i for i, c in enumerate(columns) if c.name in keys and isinstance(c.dtype, _RANGED)]
    tally = typer.tally(spark._jsparkSession, _array(java, java.jvm.int, ranged))  # noqa: SLF001 - JVM session
    jdf = typer.typedRows(lines._jdf, view.org.apache.spark.sql.types.DataType.fromJson(out.json()),  # noqa: SLF001
                          _array(java, java.jvm.boolean, [c.nullable for c in columns]), order_shift,
                          _array(java, view.java.lang.String, list(words)), tally)
    return DataFrame(jdf, spark), LineTally(tally, tuple(columns[i] for i in ranged))


def _array(java: Any, kind: Any, values: Sequence[Any]) -> Any:
    out = java.new_array(kind, len(values))
    for i, v in enumerate(values):
        out[i] = v
    return out


def _load(spark: Any) -> JavaObject | None:
    """The class, loaded once per session (its jar added once), or None where it cannot be built."""
    try:
        jar = _jar()
    except RuntimeSetupError:
        return None  # no javac here: the lines are typed by Spark expressions instead
    return session_class(spark, jar, CLASS_NAME)


def _instance(spark: Any, typer_class: JavaObject, columns: Sequence[TargetColumn], keys: Sequence[str],
              known: Sequence[str]) -> JavaObject:
    """A typer for these columns."""
    view, java = jvm(spark), gateway(spark)
    kinds = [next((k for t, k in _KINDS if isinstance(c.dtype, t)), _OTHER) for c in columns]
    decimals = [c.dtype if isinstance(c.dtype, T.DecimalType) else T.DecimalType(1, 0) for c in columns]
    arguments = [_array(java, view.java.lang.String, [c.name for c in columns]), _array(java, java.jvm.int, kinds),
                 _array(java, java.jvm.int, [d.precision for d in decimals]),
                 _array(java, java.jvm.int, [d.scale for d in decimals]),
                 _array(java, java.jvm.boolean, [c.name in keys for c in columns]),
                 _array(java, view.java.lang.String, list(known))]
    return typer_class.getConstructors()[0].newInstance(_array(java, view.java.lang.Object, arguments))  # its one


def _jar() -> Path:
    return classes_jar(compiled_classes(SOURCE, pyspark_jars(), "line-typer", "icecdc/typing/LineTyper.class"))
