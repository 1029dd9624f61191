"""OpenLineage events of real batch runs: START then COMPLETE per step (FAIL when a step fails),
through the file transport of a ``lineage:`` block and an HTTP receiver set by OPENLINEAGE_URL;
every event and facet validated against the OpenLineage spec's JSON schemas, formats included
(``date-time``, ``uri``, ``uuid``: a schema validator ignores them unless given a format checker)."""

import copy
import json
import re
import threading
import uuid
from datetime import datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from urllib.parse import urlparse

import jsonschema
import pytest
from referencing import Registry, Resource

from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from tests.dagster_layer.harness import tick
from tests.helpers import write_pipeline

SPEC = Path(__file__).parent.parent / "fixtures" / "openlineage"
OUR_FACET = Path(__file__).parent.parent.parent / "docs" / "openlineage" / "IcecdcBatchRunFacet.json"


FORMATS = jsonschema.FormatChecker()   # the library's own checks (uuid, ...), and the two it only has with extras:
RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[^\s<>\"{}|\\^`]*")


@FORMATS.checks("date-time", raises=ValueError)
def _date_time(value: object) -> bool:
    """RFC 3339 (JSON Schema's date-time): the shape, and a real date and time."""
    if not isinstance(value, str):
        return True
    if not RFC3339.fullmatch(value):
        return False
    datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    return True


@FORMATS.checks("uri")
def _uri(value: object) -> bool:
    """RFC 3986 absolute URI: a scheme, then no characters a URI cannot hold."""
    return not isinstance(value, str) or URI.fullmatch(value) is not None


def _registry() -> Registry:
    schemas = [json.loads(p.read_text()) for p in [*SPEC.glob("*.json"), OUR_FACET]]
    return Registry().with_resources((s["$id"], Resource.from_contents(s)) for s in schemas)


def _validate(event: dict, registry: Registry) -> None:
    """The event against OpenLineage.json, and every facet against the schema its _schemaURL names."""
    def check(instance: dict, url: str) -> None:
        schema = {"$ref": url}
        jsonschema.Draft202012Validator(schema, registry=registry, format_checker=FORMATS).validate(instance)

    check(event, event["schemaURL"])
    facets = [*event["run"].get("facets", {}).values(), *event["job"].get("facets", {}).values()]
    for dataset in [*event.get("inputs", []), *event.get("outputs", [])]:
        facets += [*dataset.get("facets", {}).values(), *dataset.get("outputFacets", {}).values()]
    for facet in facets:
        check(facet, facet["_schemaURL"])


class _Receiver(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.path, json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_validator_checks_formats_not_only_types():
    """A well-formed event passes; the same event with a time, a run id or a producer of the wrong format
    is refused (without a format checker all three would pass: they are strings)."""
    registry = _registry()
    event = {"eventTime": "2024-03-01T10:00:00.123+02:00", "eventType": "START",
             "producer": "https://github.com/icecdc/icecdc_dagster",
             "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
             "run": {"runId": str(uuid.uuid4())}, "job": {"namespace": "shop", "name": "replica/db/items"},
             "inputs": [], "outputs": []}
    _validate(event, registry)
    for path, bad in [(("eventTime",), "2024-03-01 10:00"), (("eventTime",), "2024-13-01T10:00:00Z"),
                      (("run", "runId"), "run-1"), (("producer",), "icecdc dagster")]:
        broken = copy.deepcopy(event)
        *parents, key = path
        target = broken
        for parent in parents:
            target = target[parent]
        target[key] = bad
        with pytest.raises(jsonschema.ValidationError, match="is not a"):
            _validate(broken, registry)


@pytest.fixture
def receiver():
    _Receiver.received = []
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", _Receiver.received
    server.shutdown()


def test_batch_steps_emit_valid_openlineage_runs_to_a_file_and_to_an_http_receiver(
        spark, catalog_settings, catalog, instance, tmp_path, receiver, monkeypatch):
    fq = f"{catalog_settings.name}.db.parcels"
    spark.sql(f"CREATE TABLE {fq} (id BIGINT NOT NULL, city STRING) USING iceberg "
              f"TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {fq} VALUES (1, 'Oslo'), (2, 'Lima'), (3, 'Pune')")
    events_file = tmp_path / "lineage.ndjson"
    tables = [{"table_name": "db.parcels", "identifier_columns": ["id"],
               "sinks": [{"iceberg": {"table_name": "db.parcels_copy"}},
                         {"opensearch": {"hosts": ["http://127.0.0.1:1"], "index": "parcels", "max_retries": 0,
                                         "request_timeout_s": 2}}]}]
    path = write_pipeline(tmp_path / "p.yaml", catalog_settings, tables, lineage={
        "namespace": "shop", "transport": {"type": "file", "log_file_path": str(events_file), "append": True}})
    config = load_config(path)
    ran = tick(build_definitions(config), instance, config.tables[0])
    assert ran.succeeded == [False]          # the index is unreachable: that step fails, the others run

    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    registry = _registry()
    for event in events:
        _validate(event, registry)
    by_job = {}
    for event in events:
        by_job.setdefault(event["job"]["name"], []).append(event)
    assert {e["job"]["namespace"] for e in events} == {"shop"}
    assert [e["eventType"] for e in by_job["changelog/db/parcels_changelog"]] == ["START", "COMPLETE"]
    assert [e["eventType"] for e in by_job["replica/db/db_parcels_copy"]] == ["START", "COMPLETE"]
    assert [e["eventType"] for e in by_job["opensearch/parcels_opensearch"]] == ["START", "FAIL"]
    failed = by_job["opensearch/parcels_opensearch"][-1]
    assert "errorMessage" in failed["run"]["facets"] and failed["outputs"][0]["namespace"] == "opensearch://127.0.0.1:1"

    bootstrap = str(catalog.load_table("db.parcels").current_snapshot().snapshot_id)
    done = by_job["replica/db/db_parcels_copy"][-1]
    assert done["run"]["facets"]["icecdc_batch"]["snapshotId"] == bootstrap
    (source,) = done["inputs"]
    assert source["namespace"] == "file" and source["name"].endswith("parcels__changelog")
    (replica,) = done["outputs"]
    location = catalog.load_table("db.parcels_copy").location()
    assert replica["name"] == urlparse(location).path and replica["namespace"] == "file"
    assert replica["facets"]["symlinks"]["identifiers"][0]["name"] == f"{catalog_settings.name}.db.parcels_copy"
    assert [f["name"] for f in replica["facets"]["schema"]["fields"]] == ["id", "city"]
    assert replica["outputFacets"]["outputStatistics"]["rowCount"] == 3
    city = replica["facets"]["columnLineage"]["fields"]["city"]["inputFields"]
    assert [(f["namespace"], f["name"], f["field"]) for f in city] == [("file", source["name"], "city")]
    store = by_job["changelog/db/parcels_changelog"][-1]["outputs"][0]
    assert store["outputFacets"]["outputStatistics"]["rowCount"] == 3

    # OpenLineage's own configuration: OPENLINEAGE_URL, no lineage block in the pipeline file.
    url, received = receiver
    monkeypatch.setenv("OPENLINEAGE_URL", url)
    plain = load_config(write_pipeline(tmp_path / "q.yaml", catalog_settings,
                                       [{**tables[0], "sinks": tables[0]["sinks"][:1]}]))
    spark.sql(f"DELETE FROM {fq} WHERE id = 2")
    assert tick(build_definitions(plain), instance, plain.tables[0]).succeeded == [True]
    posted = [event for _, event in received]
    assert {p for p, _ in received} == {"/api/v1/lineage"}
    assert sorted(e["eventType"] for e in posted) == ["COMPLETE", "COMPLETE", "START", "START"]
    for event in posted:
        _validate(event, registry)
    deleted = next(e for e in posted if e["eventType"] == "COMPLETE" and e["job"]["name"].startswith("replica"))
    assert deleted["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] == 1


def test_ingest_runs_emit_the_landing_to_table_edge(spark, catalog_settings, catalog, instance, tmp_path):
    """landing location -> ingest job -> target table (+ its dead letters) -> changelog job: one chain
    in any OpenLineage consumer, with schema, column lineage and row counts (issue 31, item 13)."""
    from dagster import AssetKey

    from tests.dagster_layer.harness import drain, drain_sensor

    landing = tmp_path / "landing"
    landing.mkdir()
    envelope = {"op": "c", "before": None, "ts_ms": 1, "source": {"schema": "shop", "table": "customers"}}
    lines = [json.dumps({"payload": {**envelope, "after": {"id": i, "name": f"n{i}"}}}) for i in range(3)]
    (landing / "001.json").write_text("\n".join([*lines, '{"payload": {"op": "x"}}']) + "\n")
    events_file = tmp_path / "lineage.ndjson"
    path = write_pipeline(tmp_path / "p.yaml", catalog_settings, [{"table_name": "db.customers"}],
                          ingest=[{"name": "customers_cdc", "landing": str(landing), "target": "db.customers",
                                   "identifier_columns": ["id"], "auto_create": True}],
                          lineage={"transport": {"type": "file", "log_file_path": str(events_file), "append": True}})
    config = load_config(path)
    defs = build_definitions(config)
    ingest = AssetKey(["ingest", "customers_cdc"])
    assert all(all(t.succeeded) for t in drain_sensor(defs, instance, "landing__customers_cdc", [ingest]))
    assert all(all(t.succeeded) for t in drain(defs, instance, config.tables[0]))

    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    registry = _registry()
    for event in events:
        _validate(event, registry)
    started, done = [e for e in events if e["job"]["name"] == "ingest/customers_cdc"]
    assert (started["eventType"], done["eventType"]) == ("START", "COMPLETE")
    (source,) = done["inputs"]
    assert (source["namespace"], source["name"]) == ("file", str(landing))
    assert [f["name"] for f in source["facets"]["schema"]["fields"]] == ["id", "name"]
    target, dead = done["outputs"]
    table = catalog.load_table("db.customers")
    assert target["name"] == urlparse(table.location()).path
    assert target["outputFacets"]["outputStatistics"]["rowCount"] == 3
    name = target["facets"]["columnLineage"]["fields"]["name"]["inputFields"]
    assert [(f["namespace"], f["name"], f["field"]) for f in name] == [("file", str(landing), "name")]
    assert dead["facets"]["symlinks"]["identifiers"][0]["name"].endswith("db.customers__dead_letters")
    assert dead["outputFacets"]["outputStatistics"]["rowCount"] == 1
    assert done["run"]["facets"]["icecdc_batch"]["snapshotId"] == str(table.current_snapshot().snapshot_id)
    changelog = next(e for e in events if e["job"]["name"].startswith("changelog/") and e["eventType"] == "COMPLETE")
    assert changelog["inputs"][0]["name"] == target["name"]          # the edge continues: table -> changelog
