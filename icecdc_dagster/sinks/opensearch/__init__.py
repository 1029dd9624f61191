"""OpenSearch sink: bulk INDEX/DELETE from Spark executors with external versioning.

Public API: :class:`OpenSearchSinkSettings`, :class:`OpenSearchSink`,
:func:`iceberg_schema_to_mapping`, :func:`write_events`.
"""

from icecdc_dagster.sinks.opensearch.actions import WriteSummary
from icecdc_dagster.sinks.opensearch.mapping import iceberg_schema_to_mapping
from icecdc_dagster.sinks.opensearch.settings import OpenSearchSinkSettings
from icecdc_dagster.sinks.opensearch.sink import DeleteWithoutDocumentIdError, OpenSearchSink, write_events

__all__ = ["DeleteWithoutDocumentIdError", "OpenSearchSink", "OpenSearchSinkSettings", "WriteSummary",
           "iceberg_schema_to_mapping", "write_events"]
