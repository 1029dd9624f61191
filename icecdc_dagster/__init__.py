"""icecdc_dagster: Iceberg change data capture as Dagster assets.

``IcecdcComponent`` (for ``dg``: ``type: icecdc_dagster.IcecdcComponent``) and ``icecdc_definitions`` (plain
Python) are imported on first use: the CLI and the engine do not pay for Dagster's components machinery."""

from typing import Any

__version__ = "0.1.0"

_LAZY = {"IcecdcComponent": "icecdc_dagster.component", "icecdc_definitions": "icecdc_dagster.component",
         "IcecdcAsset": "icecdc_dagster.component"}

__all__ = ["IcecdcAsset", "IcecdcComponent", "__version__", "icecdc_definitions"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib  # only for the lazy names: the package import stays free

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'icecdc_dagster' has no attribute {name!r}")


def __dir__() -> list[str]:
    """``dg`` finds components by ``dir()`` of the registered module."""
    return sorted({*globals(), *_LAZY})
