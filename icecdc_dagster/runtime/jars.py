"""Where the Iceberg and JDBC jars come from. Nothing is ever downloaded.

- The Iceberg Spark runtime comes from the installed ``snowpark-connect-deps-iceberg``
  wheel (or ``ICECDC_ICEBERG_RUNTIME_JAR``).
- The relocated Jackson it lacks is built once and cached in ``ICECDC_CACHE_DIR``
  (default ``~/.cache/icecdc_dagster``).
- JDBC drivers come from Debian packages, or from ``ICECDC_SQLITE_JDBC_JAR`` /
  ``ICECDC_POSTGRES_JDBC_JAR``.
"""

import hashlib
import os
from pathlib import Path

from icecdc_dagster.errors import RuntimeSetupError
from icecdc_dagster.runtime.jackson_relocation import build_relocated_jackson_jar

ICEBERG_VERSION = "1.10.2"
RUNTIME_JAR_NAME = f"iceberg-spark-runtime-3.5_2.12-{ICEBERG_VERSION}.jar"
DEBIAN_SQLITE_JAR = Path("/usr/share/java/sqlite-jdbc.jar")
DEBIAN_POSTGRES_JAR = Path("/usr/share/java/postgresql.jar")
DEBIAN_JNI_DIRS = (Path("/usr/lib/x86_64-linux-gnu/jni"), Path("/usr/lib/aarch64-linux-gnu/jni"),
                   Path("/usr/lib/jni"))


def cache_dir() -> Path:
    return Path(os.environ.get("ICECDC_CACHE_DIR", Path.home() / ".cache" / "icecdc_dagster"))


def iceberg_runtime_jar() -> Path:
    override = os.environ.get("ICECDC_ICEBERG_RUNTIME_JAR")
    if override:
        path = Path(override)
    else:
        try:
            import snowpark_connect_deps_iceberg
        except ImportError as exc:
            raise RuntimeSetupError(
                "Iceberg Spark runtime jar not found: install the 'snowpark-connect-deps-iceberg' "
                "package or set ICECDC_ICEBERG_RUNTIME_JAR") from exc
        path = Path(snowpark_connect_deps_iceberg.__file__).parent / "jars" / RUNTIME_JAR_NAME
    if not path.is_file():
        raise RuntimeSetupError(f"Iceberg Spark runtime jar not found at {path}")
    return path


def relocated_jackson_jar(runtime_jar: Path) -> Path:
    """The cached relocated-Jackson jar for ``runtime_jar``, built on first use."""
    stat = runtime_jar.stat()
    tag = hashlib.sha1(f"{runtime_jar}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_dir() / f"iceberg-{ICEBERG_VERSION}-relocated-jackson-{tag}.jar"
    if not target.is_file():
        build_relocated_jackson_jar(runtime_jar, target)
    return target


def iceberg_jars() -> list[Path]:
    runtime = iceberg_runtime_jar()
    return [runtime, relocated_jackson_jar(runtime)]


def jdbc_driver_jar(kind: str) -> Path:
    """The JDBC driver jar for ``kind`` ('sqlite' or 'postgresql')."""
    env, default, package = {
        "sqlite": ("ICECDC_SQLITE_JDBC_JAR", DEBIAN_SQLITE_JAR, "libxerial-sqlite-jdbc-java"),
        "postgresql": ("ICECDC_POSTGRES_JDBC_JAR", DEBIAN_POSTGRES_JAR, "libpostgresql-jdbc-java"),
    }[kind]
    path = Path(os.environ.get(env) or default)
    if not path.is_file():
        raise RuntimeSetupError(
            f"{kind} JDBC driver jar not found at {path}: install the Debian package "
            f"'{package}' or set {env} to the jar's path")
    return path


def sqlite_native_library_dir() -> Path | None:
    """Debian's sqlite-jdbc keeps its native library outside the jar; Java must be told where."""
    for directory in DEBIAN_JNI_DIRS:
        if (directory / "libsqlitejdbc.so").is_file():
            return directory
    return None
