"""``EqualityDeltaWriter.java`` (next to this file) loaded into a running Spark session.

Spark cannot write equality deletes, so the ``equality_deletes`` write mode uses Iceberg's own delete
writers from a small Java class: compiled on first use (:mod:`javac`), packed as a jar that the session
ships to its executors (``addJar``), and loaded on the driver by a class loader over the session's own
(which holds Iceberg and Spark). One instance per SparkContext.
"""

import threading
from pathlib import Path
from typing import Any

from icecdc_dagster.runtime import jars as jarlib
from icecdc_dagster.runtime.java import JavaObject, gateway, jvm
from icecdc_dagster.runtime.javac import classes_jar, compiled_classes, pyspark_jars, session_class

SOURCE = Path(__file__).with_name("EqualityDeltaWriter.java")
CLASS_NAME = "icecdc.eqdel.EqualityDeltaWriter"
_LOCK = threading.Lock()
_LOADED: dict[str, JavaObject] = {}  # SparkContext application id -> the writer instance


def writer_classpath() -> list[Path]:
    """What the writer compiles against: the Iceberg runtime and PySpark's own jars (Spark, Scala)."""
    return [jarlib.iceberg_runtime_jar(), *pyspark_jars()]


def writer_jar() -> Path:
    """The writer's jar, compiled and packed once per source and class path."""
    classes = compiled_classes(SOURCE, writer_classpath(), "eqdel-writer", "icecdc/eqdel/EqualityDeltaWriter.class")
    return classes_jar(classes)


def equality_delta_writer(spark: Any) -> JavaObject:
    """The session's ``EqualityDeltaWriter`` (its jar added to the SparkContext for the executors)."""
    app = str(spark.sparkContext.applicationId)
    with _LOCK:
        if app not in _LOADED:
            _LOADED[app] = _load(spark, writer_jar())
        return _LOADED[app]


def _load(spark: Any, jar: Path) -> JavaObject:
    no_types = gateway(spark).new_array(jvm(spark).java.lang.Class, 0)
    no_args = gateway(spark).new_array(jvm(spark).java.lang.Object, 0)
    return session_class(spark, jar, CLASS_NAME).getDeclaredConstructor(no_types).newInstance(no_args)
