"""One class-data-sharing archive of a Spark driver JVM's classes, made once per machine, for every JVM a
test run starts (the session's own and each ``icecdc sync`` a test starts as a subprocess).

A Spark JVM spends most of its start loading and verifying ~15,000 classes from ~250 jars: ~7.5 CPU-s
from launch to its first Iceberg query here, ~4.5 CPU-s with the JDK's dynamic archive of them
(``-XX:ArchiveClassesAtExit`` once, then ``-XX:SharedArchiveFile``). A suite starts a hundred or so JVMs.

The archive is written by a JVM at its normal exit; a JVM killed while writing leaves a truncated file,
and mapping one crashes the next JVM (SIGBUS). So it is made by a run of its own before any test starts,
written to a temporary name and renamed into place only after that JVM exited cleanly. An archive of
another JDK or class path is ignored by the JVM (``-Xshare:auto``, the default), and the key below
changes with both. Test-only: product JVMs keep the JDK's defaults.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"   # no line per class the archive skips or cannot use

# Runs in a subprocess: a session with both JDBC drivers, an Iceberg table written, merged and read.
_WORKLOAD = """
import json
import sys
from pyspark import SparkContext
from icecdc_dagster.runtime.catalog import CatalogSettings
from icecdc_dagster.runtime.spark import SparkSettings, build_spark_session

root, options, conf = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
catalog = CatalogSettings(name="archive", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")
spark = build_spark_session(SparkSettings(master="local[2]", conf={
    "spark.ui.enabled": "false", "spark.driver.extraJavaOptions": options, **conf},
    jdbc_drivers=("sqlite", "postgresql")), [catalog])
spark.sql("CREATE NAMESPACE archive.db")
spark.sql("CREATE TABLE archive.db.t (id BIGINT, v STRING) USING iceberg PARTITIONED BY (bucket(2, id)) "
          "TBLPROPERTIES ('format-version'='2', 'write.merge.mode'='merge-on-read')")
spark.sql("INSERT INTO archive.db.t SELECT id, CAST(id AS STRING) FROM range(100)")
spark.sql("MERGE INTO archive.db.t t USING (SELECT id, 'x' AS v FROM range(50, 150)) s ON t.id = s.id "
          "WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *")
spark.sql("DELETE FROM archive.db.t WHERE id < 10")
spark.table("archive.db.t").groupBy("v").count().collect()
spark.sql("SELECT * FROM archive.db.t.snapshots").collect()
proc = SparkContext._gateway.proc
spark.stop()
proc.stdin.close()                 # the gateway JVM exits on EOF, writing the archive
sys.exit(proc.wait(timeout=300))
"""


def _key(base_options: str, conf: dict[str, str]) -> str:
    import pyspark

    from icecdc_dagster.runtime import jars, local_fs
    from icecdc_dagster.runtime.java import ensure_java_home

    java = ensure_java_home().resolve()
    spark_jars = sorted(str(p) for p in (Path(pyspark.__file__).parent / "jars").iterdir())   # paths: the class path
    parts = [str(java), (java / "release").read_text() if (java / "release").exists() else "", pyspark.__version__,
             base_options, *spark_jars, *(str(p) for p in jars.iceberg_jars()), json.dumps(conf, sort_keys=True),
             json.dumps(local_fs.spark_conf(), sort_keys=True)]  # a local session's own class path
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def ensure_archive(cache_dir: Path, base_options: str, conf: dict[str, str]) -> Path | None:
    """The archive for JVMs started with ``base_options`` and the Spark settings ``conf`` (the class path must
    be the one the archive was made with, ``spark.driver.extraClassPath`` included), made now if this machine
    has none; None if it cannot be made (the tests then run without one)."""
    path = cache_dir / "class-archives" / f"spark-{_key(base_options, conf)}.jsa"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        partial = path.with_suffix(f".{os.getpid()}.part")
        options = f"{base_options} -XX:ArchiveClassesAtExit={partial} {QUIET}"
        done = subprocess.run([sys.executable, "-c", _WORKLOAD, root, options, json.dumps(conf)], capture_output=True,
                              timeout=600, env={**os.environ, "ICECDC_CACHE_DIR": str(cache_dir)})
        if done.returncode != 0 or not partial.exists() or partial.stat().st_size == 0:
            partial.unlink(missing_ok=True)
            return None
        os.replace(partial, path)
    _keep_newest(path.parent, KEEP)
    return path


KEEP = 4   # archives kept per machine (~150 MB each; every clone's virtualenv is another class path)


def _keep_newest(folder: Path, keep: int) -> None:
    """Remove all but the ``keep`` newest archives. A JVM that mapped a removed one keeps its mapping; one
    started later with its path runs without an archive (``-Xshare:auto``)."""
    archives = sorted(folder.glob("spark-*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in archives[keep:]:
        old.unlink(missing_ok=True)


def archive_options(path: Path) -> str:
    return f"-XX:SharedArchiveFile={path} {QUIET}"
