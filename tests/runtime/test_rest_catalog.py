"""The REST catalog path: Iceberg's REST client in Spark needs the relocated HttpClient jar; catalog
properties (token, credential, scope, prefix, header.*) reach both engines, against our REST server
configured to refuse a request without them; ``icecdc rest-server`` serves a catalog for trials."""

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile

import pyarrow as pa
import pytest
from pyiceberg.exceptions import NoSuchNamespaceError

from icecdc_dagster.config import parse_config
from icecdc_dagster.errors import AccessRefusedError
from icecdc_dagster.runtime import jars
from icecdc_dagster.runtime.relocation import TLS_SOCKET_STRATEGY
from icecdc_dagster.runtime.rest_server import RestServerOptions, start_rest_server
from icecdc_dagster.runtime.spark import attach_catalog

SHADED_HC = "org/apache/iceberg/shaded/org/apache/hc/"


def test_relocated_http_client_jar_is_built_once_with_the_classes_icebergs_rest_client_names(tmp_path, monkeypatch):
    monkeypatch.setenv("ICECDC_CACHE_DIR", str(tmp_path))
    built = jars.relocated_http_client_jar()
    assert built is not None, "bootstrap.sh installs libhttpclient5-java and libhttpcore5-java"
    mtime = built.stat().st_mtime_ns
    assert jars.relocated_http_client_jar() == built and built.stat().st_mtime_ns == mtime
    with zipfile.ZipFile(built) as jar:
        names = set(jar.namelist())
        stub = jar.read(TLS_SOCKET_STRATEGY + ".class")
    for name in ("client5/http/impl/classic/HttpClientBuilder", "core5/http/Method",
                 "core5/http2/HttpVersionPolicy", "client5/http/ssl/TlsSocketStrategy"):
        assert f"{SHADED_HC}{name}.class" in names
    assert not any(n.startswith("org/apache/hc/") for n in names)
    assert stub.startswith(b"\xca\xfe\xba\xbe") and TLS_SOCKET_STRATEGY.encode() in stub
    # Every HttpClient class Iceberg's REST code names is in the jar: what the JVM will look for.
    named = set()
    with zipfile.ZipFile(jars.iceberg_runtime_jar()) as runtime:
        for entry in runtime.namelist():
            if entry.startswith("org/apache/iceberg/rest/") and entry.endswith(".class"):
                named |= set(re.findall(rb"org/apache/iceberg/shaded/org/apache/hc/[\w/$]+", runtime.read(entry)))
    assert len(named) > 30
    missing = {n.decode() for n in named if n.decode() + ".class" not in names}
    assert not missing, missing


def test_missing_http_client_jars_are_named_with_the_packages_when_a_rest_catalog_needs_them(tmp_path, monkeypatch):
    monkeypatch.setenv("ICECDC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ICECDC_HTTPCLIENT5_JARS", str(tmp_path / "absent.jar"))
    assert len(jars.iceberg_jars()) == 2
    from icecdc_dagster.errors import RuntimeSetupError

    with pytest.raises(RuntimeSetupError, match="libhttpclient5-java libhttpcore5-java"):
        jars.iceberg_jars(rest=True)


@pytest.fixture(scope="module")
def guarded_server(tmp_path_factory, spark):
    """A REST server that answers only with the token (or the credential that buys it), under prefix
    ``p1`` and with the header ``X-Icecdc-Trial: yes``."""
    root = tmp_path_factory.mktemp("guarded-rest")
    server = start_rest_server(RestServerOptions(
        db=root / "catalog.db", warehouse=f"file://{root}/warehouse", prefix="p1", token="t0ken",
        credential="icecdc:s3cret", headers={"X-Icecdc-Trial": "yes"}))
    yield server
    server.close()


def _settings(server, name, properties, monkeypatch):
    monkeypatch.setenv("GUARDED_SECRET", properties.pop("secret"))
    secret_key = properties.pop("secret_key")
    config = parse_config({"catalog": {"type": "rest", "name": name, "uri": server.url, "properties": {
        secret_key: {"env": "GUARDED_SECRET"}, **properties}}})
    return config.catalog.settings()


@pytest.mark.parametrize("secret_key, secret", [("token", "t0ken"), ("credential", "icecdc:s3cret")])
def test_token_credential_prefix_and_headers_reach_pyiceberg_and_spark(spark, guarded_server, monkeypatch,
                                                                       secret_key, secret):
    name = f"guarded_{secret_key}"
    settings = _settings(guarded_server, name, {"secret_key": secret_key, "secret": secret, "prefix": "p1",
                                                "scope": "catalog", "header.X-Icecdc-Trial": "yes"}, monkeypatch)
    catalog = settings.load_pyiceberg()
    namespace = f"ns_{secret_key}"
    catalog.create_namespace(namespace)
    table = catalog.create_table(f"{namespace}.t", schema=pa.schema([("id", pa.int64())]))
    table.append(pa.table({"id": [1, 2]}))
    attach_catalog(spark, settings)
    spark.sql(f"INSERT INTO {name}.{namespace}.t VALUES (3)")
    assert sorted(r.id for r in spark.table(f"{name}.{namespace}.t").collect()) == [1, 2, 3]
    assert sorted(catalog.load_table(f"{namespace}.t").scan().to_arrow()["id"].to_pylist()) == [1, 2, 3]


@pytest.mark.parametrize("drop, error, says", [
    ("header.X-Icecdc-Trial", AccessRefusedError, "ForbiddenError"), ("prefix", NoSuchNamespaceError, ""),
    ("secret", AccessRefusedError, "UnauthorizedError")])
def test_the_guarded_server_refuses_a_client_without_each_property(guarded_server, drop, error, says, monkeypatch):
    """The test above would pass against a server that checks nothing; this one shows it checks. A refusal
    reaches the caller as the terminal ``AccessRefusedError`` naming the catalog and the server's answer,
    never the value sent."""
    properties = {"secret_key": "token", "secret": "t0ken", "prefix": "p1", "header.X-Icecdc-Trial": "yes"}
    if drop == "secret":
        properties["secret"] = "n0t-the-s3cret"
    else:
        properties.pop(drop)
    with pytest.raises(error, match=says) as refused:
        _settings(guarded_server, "guarded", properties, monkeypatch).load_pyiceberg().list_tables("db")
    assert "t0ken" not in str(refused.value) and "n0t-the-s3cret" not in str(refused.value)
    if error is AccessRefusedError:
        assert "catalog 'guarded'" in str(refused.value)


def test_rest_server_command_serves_a_catalog_for_trials(tmp_path, tmp_path_factory):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.setdefault("ICECDC_CACHE_DIR", str(tmp_path_factory.getbasetemp().parent / "icecdc-cache"))
    process = subprocess.Popen([sys.executable, "-m", "icecdc_dagster.cli", "rest-server", "--dir", str(tmp_path),
                                "--port", "0"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        first = process.stdout.readline()
        assert first.startswith("Iceberg REST catalog 'lake' at http://127.0.0.1:"), first
        url = first.split(" at ")[1].split(" ")[0]
        assert f"uri: {url}" in process.stdout.readline() + process.stdout.readline()
        from pyiceberg.catalog import load_catalog

        catalog = load_catalog("lake", type="rest", uri=url)
        catalog.create_namespace("trial")
        catalog.create_table("trial.t", schema=pa.schema([("id", pa.int64())]))
        assert catalog.list_tables("trial") == [("trial", "t")]
        assert (tmp_path / "catalog.db").is_file() and (tmp_path / "warehouse" / "trial" / "t").is_dir()
        # Its owner killed outright (no clean-up runs): the kernel stops the server JVM with it.
        process.kill()
        process.wait(timeout=30)
        assert _stops_answering(url), "the REST catalog JVM outlived the process that started it"
    finally:
        process.kill()
        process.wait(timeout=30)


def _stops_answering(url: str, within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/v1/config", timeout=2).close()
        except urllib.error.HTTPError:
            pass  # still up, answering
        except OSError:
            return True
        time.sleep(0.2)
    return False


def test_spark_gets_the_http_client_jar_and_a_users_spark_jars_come_after_the_bundled_ones(tmp_path, monkeypatch):
    from icecdc_dagster.runtime.catalog import CatalogSettings
    from icecdc_dagster.runtime.spark import SparkSettings, spark_builder_conf

    monkeypatch.setenv("ICECDC_CACHE_DIR", str(tmp_path))
    rest = CatalogSettings("cat", "http://127.0.0.1:8181", None, {"credential": "id:secret"}, type="rest")
    bundle = "/opt/jars/iceberg-aws-bundle-1.10.2.jar"
    conf = spark_builder_conf(SparkSettings(conf={"spark.jars": bundle}), [rest])
    listed = conf["spark.jars"].split(",")
    assert listed[0].endswith(jars.RUNTIME_JAR_NAME) and listed[-1] == bundle
    assert str(jars.relocated_http_client_jar()) in listed
    assert conf["spark.sql.catalog.cat.credential"] == "id:secret"
    assert "credential" in conf["spark.redaction.regex"] and "spark.sql.catalog.cat.warehouse" not in conf
