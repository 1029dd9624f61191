"""``LocalFileSystem.java`` (next to this file): Hadoop's local file system without a process per file.

Compiled before a local session's JVM starts and put on its class path as the ``file:`` scheme's
implementation (:func:`spark_conf`). Only for local masters: a cluster's executors would not have the class.
Where the class cannot be built (no JDK's ``javac``), Hadoop's own stays.
"""


from pathlib import Path

from icecdc_dagster.errors import RuntimeSetupError
from icecdc_dagster.runtime.javac import classes_jar, compiled_classes

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
    import pyspark  # pyspark: ~0.9 s; only the jar's class path needs it

    classpath = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-*.jar"))
    return classes_jar(compiled_classes(SOURCE, classpath, "local-fs", "icecdc/fs/LocalFileSystem.class"))



