"""icecdc_dagster: Iceberg change data capture as Dagster assets."""

__version__ = "0.1.0"

__all__ = ["__version__"]
