"""``LocalFileSystem.java`` (next to this file): Hadoop's local file system without a process per file.

Compiled before a local session's JVM starts and put on its class path as the ``file:`` scheme's
implementation (:func:`spark_conf`). Only for local masters: a cluster's executors would not have the class.
Where the class cannot be built (no JDK's ``javac``), Hadoop's own stays.
"""

from pathlib import Path

from icecdc_dagster.errors import RuntimeSetupError
from icecdc_dagster.runtime.javac import classes_jar, compiled_classes, pyspark_jars

SOURCE = Path(__file__).with_name("LocalFileSystem.java")
CLASS_NAME = "icecdc.fs.LocalFileSystem"


def spark_conf() -> dict[str, str]:
    """The session settings that make ``file:`` paths use the class: its jar on the driver's class path and
    Hadoop's ``fs.file.impl``; nothing where the class cannot be built here."""
    try:
        jar = _jar()
    except RuntimeSetupError:
        return {}
    return {"spark.driver.extraClassPath": str(jar), "spark.hadoop.fs.file.impl": CLASS_NAME}


def _jar() -> Path:
    hadoop = pyspark_jars("hadoop-client-*.jar")
    classes = compiled_classes(SOURCE, hadoop, "local-fs", "icecdc/fs/LocalFileSystem.class")
    return classes_jar(classes)
