"""Hadoop's local file system without a ``chmod`` process per file, for the tests' Spark JVMs.

Without Hadoop's native library (pyspark ships none), ``RawLocalFileSystem`` sets the permissions of every
file and directory it creates by forking ``chmod``: ~4 ms of CPU each from a Spark JVM, and a test run
writes thousands of Iceberg data, manifest and metadata files. ``java/NioLocalFileSystem.java`` is the same
file system (checksum files included) setting them through ``java.nio``. Test-only: product JVMs keep
Hadoop's own. Compiled once per machine into the cache, like the package's Java helpers.
"""

from pathlib import Path

import pyspark

from icecdc_dagster.runtime.javac import classes_jar, compiled_classes

SOURCE = Path(__file__).parent / "java" / "NioLocalFileSystem.java"
CLASS = "icecdc.tests.NioLocalFileSystem"


def local_fs_jar() -> Path:
    """The compiled file system's jar (built on first use; needs the JDK's ``javac``)."""
    jars = Path(pyspark.__file__).parent / "jars"
    classpath = sorted(jars.glob("hadoop-client-api-*.jar"))
    classes = compiled_classes(SOURCE, classpath, "nio-local-fs", "icecdc/tests/NioLocalFileSystem.class")
    return classes_jar(classes)


def spark_conf(jar: Path) -> dict[str, str]:
    """The Spark settings that put it in place of Hadoop's for ``file:`` paths: on the JVM's class path
    (``spark-submit`` reads local files through it before any of ``spark.jars`` is loaded)."""
    return {"spark.driver.extraClassPath": str(jar), "spark.hadoop.fs.file.impl": CLASS}
