"""The pipeline file: one YAML that declares catalog, Spark, tables with their sinks, and ingestion.

One typed model tree (:mod:`.model`, pydantic, unknown keys forbidden) read by :mod:`.load`;
sink sections are the sink kinds' own models (:mod:`icecdc_dagster.sinks.registry`). Secrets are
never written in the file: ``password: {env: OS_PASSWORD}``. ``icecdc config-schema`` prints the
JSON schema; ``docs/configuration.md`` is generated from the same model.
"""

from icecdc_dagster.config.load import CONFIG_ENV, config_schema, load_config, parse_config
from icecdc_dagster.config.model import (
                                         CatalogConfig,
                                         IngestConfig,
                                         LineageConfig,
                                         PipelineConfig,
                                         SparkConfig,
                                         TableConfig,
)
from icecdc_dagster.fields import EnvRef, parse_duration
from icecdc_dagster.sinks.iceberg.config import IcebergSinkConfig
from icecdc_dagster.sinks.kind import SinkConfig
from icecdc_dagster.sinks.opensearch.config import OpenSearchSinkConfig

__all__ = ["CONFIG_ENV", "CatalogConfig", "EnvRef", "IcebergSinkConfig", "IngestConfig", "LineageConfig",
           "OpenSearchSinkConfig",
           "PipelineConfig", "SinkConfig", "SparkConfig", "TableConfig", "config_schema", "load_config",
           "parse_config", "parse_duration"]
