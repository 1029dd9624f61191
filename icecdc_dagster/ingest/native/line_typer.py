"""``LineTyper.java`` (next to this file): a plain line typed in one pass of a streaming JSON parser.

Compiled on first use (:mod:`icecdc_dagster.runtime.javac`) and registered per session and target columns as
a Spark function returning ``(fast, tombstone, op, ignored, v0..vn)`` (:func:`typer`). Where the class cannot
be built (no JDK's ``javac``), :func:`typer` says so with ``None`` and the caller types with Spark expressions.
"""

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecdc_dagster.errors import RuntimeSetupError
from icecdc_dagster.ingest.native.column_rules import TargetColumn
from icecdc_dagster.runtime.java import JavaObject, gateway, jvm
from icecdc_dagster.runtime.javac import classes_jar, compiled_classes, pyspark_jars, session_class

SOURCE = Path(__file__).with_name("LineTyper.java")
CLASS_NAME = "icecdc.typing.LineTyper"
FAST, TOMBSTONE, OP, IGNORED = "fast", "tombstone", "op", "ignored"
# LineTyper's column kinds; any other type is OTHER (a present value routes the line).
_KINDS: tuple[tuple[type[T.DataType], int], ...] = (
    (T.StringType, 0), (T.LongType, 1), (T.IntegerType, 2), (T.BooleanType, 3), (T.DoubleType, 4),
    (T.DecimalType, 5), (T.DateType, 6), (T.TimestampType, 7), (T.TimestampNTZType, 8), (T.BinaryType, 9))
_OTHER = 10
_LOCK = threading.Lock()
_REGISTERED: dict[tuple[str, str], str | None] = {}  # (session, target) -> function name (None: no javac)
_CLASSES: dict[str, JavaObject | None] = {}  # application id -> the class loaded in its session (None: no javac)


def value_name(i: int) -> str:
    """The result's field holding column ``i``'s value."""
    return f"v{i}"


def result_type(columns: Sequence[TargetColumn]) -> T.StructType:
    """The typer's result: the line's flags, its op (``debezium.INSERT`` / ``UPDATE`` / ``DELETE``), the count
    of image fields the table does not know, and each column's value."""
    return T.StructType([T.StructField(FAST, T.BooleanType()), T.StructField(TOMBSTONE, T.BooleanType()),
                         T.StructField(OP, T.StringType()), T.StructField(IGNORED, T.IntegerType()),
                         *[T.StructField(value_name(i), c.dtype) for i, c in enumerate(columns)]])


def typer(spark: Any, columns: Sequence[TargetColumn], keys: Sequence[str], known: Sequence[str],
          line: Column) -> Column | None:
    """``line`` typed for ``columns`` (a struct of :func:`result_type`), or None where the class cannot be built.

    Raises:
        py4j.protocol.Py4JJavaError: the session refused the function's registration.
    """
    spec = repr(([(c.name, c.dtype.json()) for c in columns], sorted(keys), sorted(known)))
    target = hashlib.sha1(spec.encode()).hexdigest()[:16]
    app, session = str(spark.sparkContext.applicationId), str(spark._jsparkSession.sessionUUID())  # noqa: SLF001
    with _LOCK:
        if (session, target) not in _REGISTERED:
            if app not in _CLASSES:
                _CLASSES[app] = _load(spark)
            typer_class = _CLASSES[app]
            _REGISTERED[(session, target)] = None if typer_class is None else _register(
                spark, typer_class, f"icecdc_type_line_{target}", columns, keys, known)
        name = _REGISTERED[(session, target)]
    return None if name is None else F.call_function(name, line)


def _load(spark: Any) -> JavaObject | None:
    """The class, loaded once per session (its jar added once), or None where it cannot be built."""
    try:
        jar = _jar()
    except RuntimeSetupError:
        return None  # no javac here: the lines are typed by Spark expressions instead
    return session_class(spark, jar, CLASS_NAME)


def _register(spark: Any, typer_class: JavaObject, name: str, columns: Sequence[TargetColumn], keys: Sequence[str],
              known: Sequence[str]) -> str:
    """A typer for these columns registered as ``name``."""
    view, java = jvm(spark), gateway(spark)

    def array(kind: Any, values: Sequence[Any]) -> Any:
        out = java.new_array(kind, len(values))
        for i, v in enumerate(values):
            out[i] = v
        return out

    kinds = [next((k for t, k in _KINDS if isinstance(c.dtype, t)), _OTHER) for c in columns]
    decimals = [c.dtype if isinstance(c.dtype, T.DecimalType) else T.DecimalType(1, 0) for c in columns]
    arguments = [array(view.java.lang.String, [c.name for c in columns]), array(java.jvm.int, kinds),
                 array(java.jvm.int, [d.precision for d in decimals]), array(java.jvm.int, [d.scale for d in decimals]),
                 array(java.jvm.boolean, [c.name in keys for c in columns]), array(view.java.lang.String, list(known))]
    instance = typer_class.getConstructors()[0].newInstance(array(view.java.lang.Object, arguments))  # its one
    returned = view.org.apache.spark.sql.types.DataType.fromJson(result_type(columns).json())
    spark._jsparkSession.udf().register(name, instance, returned)  # noqa: SLF001 - PySpark registers Python UDFs only
    return name


def _jar() -> Path:
    return classes_jar(compiled_classes(SOURCE, pyspark_jars(), "line-typer", "icecdc/typing/LineTyper.class"))
