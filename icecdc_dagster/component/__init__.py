"""icecdc_dagster inside a user's Dagster project: the ``IcecdcComponent`` for ``dg`` (``defs.yaml``) and
:func:`icecdc_definitions` for plain Python, both built from one pipeline file with the user's translation."""

from icecdc_dagster.component.component import IcecdcComponent, load_pipeline
from icecdc_dagster.component.translation import IcecdcAsset, icecdc_definitions

__all__ = ["IcecdcAsset", "IcecdcComponent", "icecdc_definitions", "load_pipeline"]
