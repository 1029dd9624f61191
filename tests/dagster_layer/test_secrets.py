"""Secrets from the environment reach servers that CHECK them, on every path (issue #47).

A pipeline file names its secrets (``{env: VARIABLE}``); the definitions' resources hold Dagster
``EnvVar``s (a ``str`` whose text is the variable's NAME) until Dagster initialises them. These scenarios
walk every path that uses them, in sequence, against servers that refuse anything but the right value:
``icecdc sync``, the snapshot sensor and its runs, ``icecdc status``, ``icecdc resync`` and the maintenance
job; then a wrong value (a terminal error naming the catalog or host and the setting, nothing applied) and
the fix (the next sync converges). Afterwards no secret value, right or wrong, is anywhere in the output,
the logs or the Dagster instance's storage (runs, tags, materialisations, compute logs).

- REST: the project's REST server requiring an OAuth2 client credential and a bearer token; the OpenSearch
  sink behind a TLS + basic-auth proxy (``tests/secret_servers.py``), its password from the environment.
- PostgreSQL: a throwaway scram-sha-256 cluster; the catalog's ``password: {env: ...}``.
"""

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from dagster import DagsterInstance, DagsterRunStatus
from opensearchpy import OpenSearch
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType, NestedField, StringType

from icecdc_dagster import cli
from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.errors import AccessRefusedError
from icecdc_dagster.lease.dagster_yaml import RECOMMENDED_DAGSTER_YAML
from icecdc_dagster.runtime.catalog import CatalogSettings
from icecdc_dagster.runtime.rest_server import RestServerOptions, start_rest_server
from tests.dagster_layer.harness import drain, tick
from tests.helpers import TEST_SPARK_CONF
from tests.secret_servers import BasicAuthTlsProxy, scram_postgres

# Distinctive values: any of them found after the test is a leak.
CREDENTIAL = "icecdc-client:Cl1entS3cret-5e7a9"
TOKEN = "T0ken-b81f-44c2-secret"
OS_PASSWORD = "0sPassw0rd-c3d9e1"
PG_PASSWORD = "PgScr4m-Pw-7d21f0"
WRONG = {"CAT_CREDENTIAL": "icecdc-client:Wr0ngS3cret-0000", "CAT_TOKEN": "Wr0ng-T0ken-1111",
         "OS_PASSWORD": "Wr0ngOsPw-2222", "CAT_DB_PASSWORD": "Wr0ngPgPw-3333"}
INDEX = "secret_items"
ARROW = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("qty", pa.int32())])
SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()),
                NestedField(3, "qty", IntegerType()), identifier_field_ids=[1])


def _rows(values):
    return pa.Table.from_pylist([{"id": i, "name": f"n{i}-{tag}", "qty": i} for i, tag in values], schema=ARROW)


def _table_rows(catalog, name):
    return sorted((r["id"], r["name"], r["qty"]) for r in catalog.load_table(name).scan().to_arrow().to_pylist())


def _documents(proxy):
    client = OpenSearch(hosts=[proxy.url], http_auth=(proxy.username, proxy.password), ca_certs=str(proxy.ca_certs))
    hits = client.search(index=INDEX, body={"query": {"match_all": {}}, "size": 1000})["hits"]["hits"]
    return sorted((int(h["_id"]), h["_source"]["name"], h["_source"]["qty"]) for h in hits)


def _pipeline(path: Path, catalog: dict, sinks: list[dict]) -> Path:
    path.write_text(yaml.safe_dump({"catalog": catalog, "spark": {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)},
                                    "tables": [{"table_name": "db.items", "sinks": sinks}]}, sort_keys=False))
    return path


def _icecdc(capfd, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    out, err = capfd.readouterr()
    return code, out + err


def _run_on_the_warm_launcher(instance, request) -> DagsterRunStatus:
    """Launch a sensor's run request as the daemon would: a run of the code location's asset job
    (``icecdc_dagster.definitions:defs``), executed by the instance's launcher."""
    from dagster._core.definitions.reconstruct import ReconstructableRepository

    recon = ReconstructableRepository.for_module("icecdc_dagster.definitions", "defs").get_reconstructable_job(
        "__ASSET_JOB")
    tags = {**request.tags, **({"dagster/partition": request.partition_key} if request.partition_key else {})}
    run = instance.create_run_for_job(job_def=recon.get_definition(), job_code_origin=recon.get_python_origin(),
                                      asset_selection=frozenset(request.asset_selection), tags=tags)
    instance.launch_run(run.run_id, workspace=None)
    instance.run_launcher.join(timeout=300)
    return instance.get_run_by_id(run.run_id).status


def _chain(exc: BaseException | None) -> str:
    """An exception and its causes, as text (Dagster wraps a sensor's error in its own)."""
    texts = []
    while exc is not None:
        texts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(texts)


def _applied(home: Path, proxy: BasicAuthTlsProxy, catalog) -> tuple:
    """What a sync could have applied: the instance's runs and materialisations, the replica, the index."""
    from dagster import DagsterEventType, EventRecordsFilter

    with DagsterInstance.from_config(str(home)) as instance:
        materializations = instance.event_log_storage.get_event_records(
            EventRecordsFilter(DagsterEventType.ASSET_MATERIALIZATION), limit=10000)
        runs = instance.get_runs_count()
    return runs, len(materializations), _table_rows(catalog, "db.items_replica"), _documents(proxy)


def _assert_no_secret_anywhere(texts: list[str], home: Path, secrets: list[str]) -> None:
    """No value in what was printed or logged, nor in any file of the instance (its SQLite storage with
    runs, tags, event logs and materialisations, and the runs' compute logs)."""
    files = [p for p in home.rglob("*") if p.is_file()]
    assert any(p.suffix == ".db" for p in files), files  # the scan reads the real storage
    for secret in secrets:
        assert not any(secret in text for text in texts), f"a secret value was printed or logged ({secret[:4]}…)"
        leaking = [str(p) for p in files if secret.encode() in p.read_bytes()]
        assert leaking == [], f"a secret value is stored in {leaking}"


def _scenario(capfd, caplog, monkeypatch, tmp_path, catalog_block: dict, good: dict[str, str], wrong_var: str,
              setting: str, where: str, proxy: BasicAuthTlsProxy, client: CatalogSettings,
              sink_paths: bool = True) -> list[str]:
    """The paths in sequence for one pipeline; returns everything printed, for the final scan.
    ``sink_paths``: also the OpenSearch password refused and ``icecdc resync`` (the same whatever the
    catalog: one scenario walks them)."""
    printed: list[str] = []
    for name, value in good.items():
        monkeypatch.setenv(name, value)
    home = tmp_path / "home"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    catalog = client.load_pyiceberg()
    catalog.create_namespace("db")
    catalog.create_table("db.items", schema=SCHEMA, properties={"format-version": "2"}).append(
        _rows([(i, "a") for i in range(1, 9)]))
    sinks = [{"opensearch": {"hosts": [proxy.url], "index": INDEX, "username": proxy.username,
                             "password": {"env": "OS_PASSWORD"}, "ca_certs": str(proxy.ca_certs)}},
             {"iceberg": {"table_name": "db.items_replica"}}]
    home.mkdir(parents=True)  # the recommended settings, with the warm launcher
    path = _pipeline(tmp_path / "pipeline.yaml", catalog_block, sinks)
    (home / "dagster.yaml").write_text(RECOMMENDED_DAGSTER_YAML.replace("MonitoredRunLauncher", "WarmRunLauncher"))
    config = ["--config", str(path), "--dagster-home", str(home)]

    def converged(step: str) -> None:
        expected = _table_rows(catalog, "db.items")
        assert _table_rows(catalog, "db.items_replica") == expected, step
        assert _documents(proxy) == expected, step

    # 1. icecdc sync: the bootstrap export into both sinks.
    code, out = _icecdc(capfd, "sync", *config)
    printed.append(out)
    assert code == 0, out
    converged("sync")

    # 2. The snapshot sensor; its run on the warm launcher (the code location's definitions built from
    # $ICECDC_CONFIG in this process, as the daemon's launcher does), then its runs in process.
    monkeypatch.setenv("ICECDC_CONFIG", str(path))
    catalog.load_table("db.items").upsert(_rows([(2, "b"), (9, "b")]), join_cols=["id"])
    loaded = load_config(path)
    defs = build_definitions(loaded)
    with DagsterInstance.get() as instance:
        assert type(instance.run_launcher).__name__ == "WarmRunLauncher"
        (request,) = tick(defs, instance, loaded.tables[0], run=False).run_requests
        assert _run_on_the_warm_launcher(instance, request) == DagsterRunStatus.SUCCESS
    converged("warm launcher")
    catalog.load_table("db.items").upsert(_rows([(5, "c"), (10, "c")]), join_cols=["id"])
    with DagsterInstance.get() as instance:
        ticks = drain(defs, instance, loaded.tables[0])
    assert ticks[0].requested and all(all(t.succeeded) for t in ticks), ticks
    converged("sensor")

    # 3. icecdc status: every sink read with its secrets, nothing pending.
    code, out = _icecdc(capfd, "status", *config, "--json")
    printed.append(out)
    document, _ = json.JSONDecoder().raw_decode(out[out.index("{"):])
    (table,) = document["tables"]
    assert [(s["name"], s["error"], s["pending_snapshots"]) for s in table["sinks"]] == [
        (s["name"], None, 0) for s in table["sinks"]] and len(table["sinks"]) == 2, out

    # 4. The maintenance job (its checks read both sinks).
    schedule = defs.resolve_schedule_def(next(s.name for s in defs.schedules if s.name.startswith("maintenance")))
    with DagsterInstance.get() as instance:
        assert defs.resolve_job_def(schedule.job_name).execute_in_process(instance=instance).success

    # 5. A wrong catalog secret: load refuses naming the catalog and the setting, nothing is applied.
    catalog.load_table("db.items").delete("id IN (3, 4)")
    before = _applied(home, proxy, catalog)
    monkeypatch.setenv(wrong_var, WRONG[wrong_var])
    code, out = _icecdc(capfd, "sync", *config)
    printed.append(out)
    assert code == 2 and "AccessRefusedError" in out and where in out and setting in out, out
    with pytest.raises(AccessRefusedError, match=setting):
        build_definitions(load_config(path))
    assert _applied(home, proxy, catalog) == before
    assert (3, "n3-a", 3) in before[2]  # the delete waits
    # The sensor's tick refuses the same way (definitions loaded without the load-time table check).
    unchecked = build_definitions(load_config(path), check_tables=False)
    with DagsterInstance.get() as instance, pytest.raises(Exception) as refused:
        drain(unchecked, instance, loaded.tables[0])
    assert setting in _chain(refused.value), _chain(refused.value)
    monkeypatch.setenv(wrong_var, good[wrong_var])
    code, out = _icecdc(capfd, "sync", *config)  # the right value again: the next sync converges
    printed.append(out)
    assert code == 0, out
    converged("fixed catalog secret")

    if sink_paths:
        catalog.load_table("db.items").append(_rows([(11, "d")]))
        _sink_paths(capfd, monkeypatch, proxy, config, converged, printed)
    printed.append(caplog.text)
    return printed


def _sink_paths(capfd, monkeypatch, proxy, config, converged, printed) -> None:  # noqa: ANN001
    # 6. A wrong OpenSearch password: the sink's step stops the line naming the host and the setting.
    monkeypatch.setenv("OS_PASSWORD", WRONG["OS_PASSWORD"])
    documents = _documents(proxy)
    code, out = _icecdc(capfd, "sync", *config)
    printed.append(out)
    assert code == 1 and proxy.url in out and "basic-auth password" in out, out
    assert _documents(proxy) == documents  # nothing applied to the index
    monkeypatch.setenv("OS_PASSWORD", OS_PASSWORD)

    # 7. Fixed: the recovery the error names converges; a resync re-exports through the same secrets.
    code, out = _icecdc(capfd, "sync", *config, "--retry-failed")
    printed.append(out)
    assert code == 0, out
    converged("fixed")
    code, out = _icecdc(capfd, "resync", *config, "--table", "db.items")
    printed.append(out)
    assert code == 0, out
    converged("resync")
    assert OS_PASSWORD in proxy.received and WRONG["OS_PASSWORD"] in proxy.received
    assert "OS_PASSWORD" not in proxy.received  # never the variable's name


@pytest.fixture
def tls_opensearch(osmem_clone, tmp_path):
    proxy = BasicAuthTlsProxy(osmem_clone.url, "icecdc", OS_PASSWORD, tmp_path)
    yield proxy
    proxy.close()


def test_rest_credential_token_and_opensearch_password_from_the_environment_on_every_path(
        spark, tmp_path, monkeypatch, capfd, caplog, tls_opensearch):
    name = "lake_" + uuid.uuid4().hex[:8]
    server = start_rest_server(RestServerOptions(db=tmp_path / "rest" / "catalog.db",
                                                 warehouse=f"file://{tmp_path}/rest/warehouse", name=name,
                                                 token=TOKEN, credential=CREDENTIAL))
    # What the catalog server received, recorded on the way (the test's own client goes around it).
    recorder = BasicAuthTlsProxy(server.url, None, None, tmp_path, tls=False)
    try:
        uri = f"{recorder.url}/{name}"
        client = CatalogSettings(name=name, uri=f"{server.url}/{name}", warehouse=None, type="rest",
                                 properties={"token": TOKEN})
        # The OAuth2 client credential (exchanged for the token at /v1/oauth/tokens).
        printed = _scenario(capfd, caplog, monkeypatch, tmp_path / "credential",
                            {"type": "rest", "name": name, "uri": uri,
                             "properties": {"credential": {"env": "CAT_CREDENTIAL"}}},
                            {"CAT_CREDENTIAL": CREDENTIAL, "OS_PASSWORD": OS_PASSWORD}, "CAT_CREDENTIAL",
                            "catalog.properties.credential", f"catalog {name!r}", tls_opensearch, client)
        home = tmp_path / "credential" / "home"
        # The bearer token itself: status reads through it; a wrong one is refused naming the setting.
        token_path = _pipeline(tmp_path / "token.yaml", {"type": "rest", "name": name, "uri": uri,
                                                         "properties": {"token": {"env": "CAT_TOKEN"}}},
                               yaml.safe_load((tmp_path / "credential" / "pipeline.yaml").read_text())
                               ["tables"][0]["sinks"])
        token_config = ["--config", str(token_path), "--dagster-home", str(home)]
        monkeypatch.setenv("CAT_TOKEN", TOKEN)
        code, out = _icecdc(capfd, "status", *token_config)
        printed.append(out)
        assert code == 0 and "error" not in out.lower(), out
        monkeypatch.setenv("CAT_TOKEN", WRONG["CAT_TOKEN"])
        code, out = _icecdc(capfd, "sync", *token_config)
        printed.append(out)
        assert code == 2 and f"catalog {name!r}" in out and "catalog.properties.token" in out, out
    finally:
        recorder.close()
        server.close()
    received = "\n".join(recorder.requests)
    client_secret = CREDENTIAL.split(":")[1]
    assert "oauth/tokens" in received and client_secret in received and f"Bearer {TOKEN}" in received
    assert WRONG["CAT_CREDENTIAL"].split(":")[1] in received and f"Bearer {WRONG['CAT_TOKEN']}" in received
    assert "CAT_CREDENTIAL" not in received and "CAT_TOKEN" not in received  # never a variable's name
    _assert_no_secret_anywhere(printed, home, [CREDENTIAL, TOKEN, OS_PASSWORD, *WRONG.values()])


def test_scram_postgres_catalog_password_from_the_environment_on_every_path(
        spark, tmp_path, monkeypatch, capfd, caplog, tls_opensearch):
    with scram_postgres("icecdc_lake", PG_PASSWORD) as postgres:
        name = "pg_" + uuid.uuid4().hex[:8]
        client = CatalogSettings(name=name, uri=postgres.url(with_password=True),
                                 warehouse=f"file://{tmp_path}/warehouse")
        printed = _scenario(capfd, caplog, monkeypatch, tmp_path,
                            {"name": name, "uri": postgres.url(), "warehouse": f"file://{tmp_path}/warehouse",
                             "password": {"env": "CAT_DB_PASSWORD"}},
                            {"CAT_DB_PASSWORD": PG_PASSWORD, "OS_PASSWORD": OS_PASSWORD}, "CAT_DB_PASSWORD",
                            "catalog.password", f"catalog {name!r}", tls_opensearch, client, sink_paths=False)
        log = (postgres.folder / "server.log").read_text()
        assert 'password authentication failed for user "icecdc_lake"' in log  # the server checked it
    _assert_no_secret_anywhere(printed, tmp_path / "home", [PG_PASSWORD, OS_PASSWORD, *WRONG.values()])
