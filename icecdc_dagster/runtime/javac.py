"""Java sources of this package compiled on first use with the JDK's ``javac``, cached in ``ICECDC_CACHE_DIR``.

The local REST catalog server and the equality-delete writer are small Java classes shipped as source:
nothing is downloaded, and a build is keyed by the source and its class path (a new Iceberg or Spark
makes a new build). Processes that race to build the same key both succeed: the first rename wins.
"""

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from icecdc_dagster.errors import RuntimeSetupError
from icecdc_dagster.runtime import jars as jarlib
from icecdc_dagster.runtime.java import JavaObject, ensure_java_home, gateway, jvm


def javac() -> Path:
    """The JDK's compiler next to the ``java`` Spark uses, else the one on PATH."""
    beside_java = ensure_java_home() / "bin" / "javac"
    on_path = shutil.which("javac")
    if beside_java.is_file():
        return beside_java
    if on_path:
        return Path(on_path)
    raise RuntimeSetupError("icecdc's Java helpers (the local REST catalog server, the equality-delete writer) are "
                            "compiled on first use and need a JDK's javac (Debian: openjdk-17-jdk-headless); a Java "
                            "runtime alone cannot build them")


def pyspark_jars(pattern: str = "*.jar") -> list[Path]:
    """PySpark's own jars matching ``pattern`` (Spark, Scala, Hadoop's client), in order: what our Java helpers
    compile against. Imports pyspark (~0.5-0.9 s): only a build needs it."""
    import pyspark  # pyspark: ~0.5-0.9 s; only a build of a helper needs it

    return sorted((Path(pyspark.__file__).parent / "jars").glob(pattern))


def compiled_classes(source: Path, classpath: Sequence[Path], prefix: str, marker: str) -> Path:
    """The directory of ``source``'s compiled classes, built once per source and class path.
    ``marker``: a class file (relative path) whose presence means the build is complete."""
    stamp = source.read_bytes() + ";".join(p.name for p in classpath).encode()
    target = jarlib.cache_dir() / f"{prefix}-{hashlib.sha1(stamp).hexdigest()[:12]}"
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{prefix}-"))
    try:
        done = subprocess.run([str(javac()), "-nowarn", "-d", str(build), "-cp", os.pathsep.join(map(str, classpath)),
                               str(source)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeSetupError(f"javac {source.name} failed:\n{done.stderr.strip()}")
        try:
            build.rename(target)
        except OSError:  # another process built it first
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return target


def classes_jar(classes: Path) -> Path:
    """A jar of a compiled-classes directory (next to it, built once): what Spark ships to its executors."""
    jar = classes.with_suffix(".jar")
    if jar.is_file():
        return jar
    partial = Path(tempfile.mkstemp(dir=classes.parent, prefix=f".{classes.name}-", suffix=".jar")[1])
    try:
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as out:
            for path in sorted(classes.rglob("*.class")):
                out.write(path, path.relative_to(classes).as_posix())
        partial.replace(jar)
    finally:
        partial.unlink(missing_ok=True)
    return jar


def session_class(spark: Any, jar: Path, class_name: str) -> JavaObject:
    """``class_name`` from ``jar``, loaded into a running session: the jar is added to the SparkContext (its
    executors load the class from it) and the class is loaded on the driver by a class loader over the
    session's own (which holds Iceberg and Spark).

    Raises:
        py4j.protocol.Py4JJavaError: the jar does not hold the class, or the JVM cannot read the jar.
    """
    view = jvm(spark)
    spark.sparkContext._jsc.addJar(str(jar))  # noqa: SLF001 - PySpark has no public addJar
    urls = gateway(spark).new_array(view.java.net.URL, 1)
    urls[0] = view.java.io.File(str(jar)).toURI().toURL()
    parent = view.java.lang.Thread.currentThread().getContextClassLoader()
    return view.java.net.URLClassLoader(urls, parent).loadClass(class_name)
