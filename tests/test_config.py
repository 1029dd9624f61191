"""The pipeline file: valid files load, and every mistake names the file and the key."""

from pathlib import Path

import pytest

from icecdc_dagster.config import EnvRef, OpenSearchSinkConfig, load_config, parse_config, parse_duration
from icecdc_dagster.errors import ConfigError

EXAMPLE = Path(__file__).parent.parent / "examples" / "two_tables.yaml"


def test_example_config_loads_with_env_secrets_and_relative_paths():
    config = load_config(EXAMPLE)
    orders = config.table("shop.orders")
    assert orders.identifier_columns == ("order_id",)
    assert orders.polling_interval_s == 5
    sink = orders.sinks[0]
    assert isinstance(sink, OpenSearchSinkConfig) and sink.password == EnvRef("OPENSEARCH_PASSWORD")
    assert config.catalog.uri == "sqlite:///" + str((EXAMPLE.parent / "../lake/catalog.db").resolve())
    assert config.catalog.warehouse.startswith("file:///")
    assert config.catalog.settings().jdbc_url().startswith("jdbc:sqlite:/")


def test_empty_config_is_valid(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty).tables == ()


@pytest.mark.parametrize("data, fragment", [
    ({"tables": [{"table_name": "db.t", "identfier_columns": ["id"]}]}, "tables[0] (db.t).identfier_columns: unknown key"),
    ({"tables": [{"identifier_columns": ["id"]}]}, "tables[0].table_name: missing required key"),
    ({"tables": [{"table_name": "db.t", "sinks": [{"kafka": {"topic": "x"}}]}]}, "sinks[0].kafka: unknown sink type"),
    ({"tables": [{"table_name": "db.t", "sinks": [{"opensearch": {"index": "x", "password": "hunter2"}}]}]},
     "opensearch.password: secrets must come from the environment"),
    ({"tables": [{"table_name": "db.t", "polling_interval": "30s"}]}, "polling_interval: '30s' is not an ISO-8601"),
    ({"tables": [{"table_name": "t"}]}, "table_name: expected <namespace>.<table>"),
    ({"tables": [{"table_name": "db.t"}, {"table_name": "db.t"}]}, "'db.t' is declared twice"),
    ({"tabels": []}, "tabels: unknown key"),
    ({"catalog": {"uri": "mysql://x/y"}}, "unsupported catalog database"),
    ({"tables": [{"table_name": "db.t", "disable_export": "yes"}]}, "disable_export: expected true or false"),
])
def test_invalid_config_names_file_and_key(data, fragment):
    with pytest.raises(ConfigError) as error:
        parse_config(data, source="pipeline.yaml")
    assert "pipeline.yaml" in str(error.value) and fragment in str(error.value)


def test_missing_file_and_bad_yaml_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tables: [\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(bad)


@pytest.mark.parametrize("text, seconds", [("PT30S", 30), ("PT5M", 300), ("PT1H30M", 5400), ("P1D", 86400),
                                           ("PT0.5S", 0.5)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["30s", "PT", "P", "PT5X", ""])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)
