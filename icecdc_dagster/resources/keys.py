"""The resource keys our definitions declare, in one place.

Prefixed with ``icecdc_`` because our definitions are merged into a user's own (a Component or
``build_definitions`` in their ``Definitions``): a user's resource named ``spark`` or ``catalog`` must
never replace ours (Dagster merges resources by key) nor be replaced by ours. A sink's connection
key (``icecdc_opensearch__<index>``) is named by its kind (``SinkConfig.resource_key``).
"""

PREFIX = "icecdc_"
CATALOG_KEY = PREFIX + "catalog"
SPARK_KEY = PREFIX + "spark"
