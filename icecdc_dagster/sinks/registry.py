"""The sink kinds a pipeline file may use, by their YAML key. A new kind is one folder + one line here."""

from icecdc_dagster.sinks.iceberg.config import IcebergSinkConfig
from icecdc_dagster.sinks.kind import SinkConfig
from icecdc_dagster.sinks.opensearch.config import OpenSearchSinkConfig

SINK_KINDS: dict[str, type[SinkConfig]] = {kind.kind: kind for kind in (OpenSearchSinkConfig, IcebergSinkConfig)}
