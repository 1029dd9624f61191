"""Where the Iceberg and JDBC jars come from. Nothing is ever downloaded.

- The Iceberg Spark runtime comes from the installed ``snowpark-connect-deps-iceberg``
  wheel (or ``ICECDC_ICEBERG_RUNTIME_JAR``).
- The relocated Jackson it lacks is built once and cached in ``ICECDC_CACHE_DIR``
  (default ``~/.cache/icecdc_dagster``); so is the relocated HTTP client its REST catalog needs, from
  Debian's ``libhttpclient5-java`` + ``libhttpcore5-java`` (or ``ICECDC_HTTPCLIENT5_JARS``).
- JDBC drivers come from Debian packages, or from ``ICECDC_SQLITE_JDBC_JAR`` /
  ``ICECDC_POSTGRES_JDBC_JAR``.
"""

import hashlib
import os
from pathlib import Path

from icecdc_dagster.errors import RuntimeSetupError
from icecdc_dagster.runtime.relocation import (
    HTTP_CLIENT,
    JACKSON,
    TLS_SOCKET_STRATEGY,
    build_relocated_jar,
    empty_interface,
)

ICEBERG_VERSION = "1.10.2"
RUNTIME_JAR_NAME = f"iceberg-spark-runtime-3.5_2.12-{ICEBERG_VERSION}.jar"
DEBIAN_SQLITE_JAR = Path("/usr/share/java/sqlite-jdbc.jar")
DEBIAN_POSTGRES_JAR = Path("/usr/share/java/postgresql.jar")
DEBIAN_HTTP_CLIENT_JARS = tuple(Path("/usr/share/java") / name
                                for name in ("httpclient5.jar", "httpcore5.jar", "httpcore5-h2.jar"))
HTTP_CLIENT_PACKAGES = "libhttpclient5-java libhttpcore5-java"
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
            import snowpark_connect_deps_iceberg  # optional: ICECDC_ICEBERG_RUNTIME_JAR replaces it
        except ImportError as exc:
            raise RuntimeSetupError(
                "Iceberg Spark runtime jar not found: install the 'snowpark-connect-deps-iceberg' "
                "package or set ICECDC_ICEBERG_RUNTIME_JAR") from exc
        path = Path(snowpark_connect_deps_iceberg.__file__).parent / "jars" / RUNTIME_JAR_NAME
    if not path.is_file():
        raise RuntimeSetupError(f"Iceberg Spark runtime jar not found at {path}")
    return path


def _cached(kind: str, inputs: list[Path]) -> Path:
    """The cache path of a jar built from ``inputs``: a new path whenever an input changes."""
    stamp = ";".join(f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in inputs)
    tag = hashlib.sha1(stamp.encode()).hexdigest()[:12]
    return cache_dir() / f"iceberg-{ICEBERG_VERSION}-relocated-{kind}-{tag}.jar"


def relocated_jackson_jar(runtime_jar: Path) -> Path:
    """The cached relocated-Jackson jar for ``runtime_jar``, built on first use."""
    target = _cached("jackson", [runtime_jar])
    if not target.is_file():
        build_relocated_jar([runtime_jar], JACKSON, target)
    return target


def http_client_jars() -> list[Path] | None:
    """HttpClient 5's jars (client, core, h2): ``ICECDC_HTTPCLIENT5_JARS`` (``os.pathsep``-separated)
    or Debian's; None when they are not there."""
    override = os.environ.get("ICECDC_HTTPCLIENT5_JARS")
    paths = [Path(p) for p in override.split(os.pathsep) if p] if override else list(DEBIAN_HTTP_CLIENT_JARS)
    return paths if paths and all(p.is_file() for p in paths) else None


def relocated_http_client_jar() -> Path | None:
    """The cached HttpClient 5 jar relocated under Iceberg's shaded prefix (what its REST catalog client
    loads), built on first use; None when the HttpClient jars are not installed."""
    inputs = http_client_jars()
    if inputs is None:
        return None
    target = _cached("httpclient5", inputs)
    if not target.is_file():
        build_relocated_jar(inputs, HTTP_CLIENT, target,
                            extra_classes={TLS_SOCKET_STRATEGY: empty_interface(TLS_SOCKET_STRATEGY)})
    return target


def iceberg_jars(rest: bool = False) -> list[Path]:
    """The Iceberg runtime and the relocated jars it needs. The HTTP client comes along whenever it is
    installed (a REST catalog may be attached to a running session); ``rest`` makes it required."""
    runtime = iceberg_runtime_jar()
    found = [runtime, relocated_jackson_jar(runtime)]
    http_client = relocated_http_client_jar()
    if http_client is not None:
        found.append(http_client)
    elif rest:
        raise RuntimeSetupError(
            "a REST catalog needs Apache HttpClient 5, which the Iceberg runtime jar lacks: install the Debian "
            f"packages '{HTTP_CLIENT_PACKAGES}' (bootstrap.sh does) or set ICECDC_HTTPCLIENT5_JARS to the "
            "httpclient5, httpcore5 and httpcore5-h2 jars (5.2 or later)")
    return found


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
