"""Small helpers shared by tests: write a pipeline file for a test catalog."""

from pathlib import Path

import yaml

from icecdc_dagster.runtime.catalog import CatalogSettings


def write_pipeline(path: Path, catalog: CatalogSettings, tables: list[dict], **extra) -> Path:
    config = {
        "catalog": {"name": catalog.name, "uri": catalog.uri, "warehouse": catalog.warehouse},
        "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}},
        "tables": tables,
        **extra,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
