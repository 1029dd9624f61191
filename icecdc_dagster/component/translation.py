"""A user's translation of our assets (key, key prefix, group, tags, description), in the style of
dagster-dbt's and dagster-sling's components, and the definitions built with it.

Keys are decided before the definitions are built, on a copy of the config (``fields.Keyed``): every
sensor, check, line, job and ``icecdc sync`` then names the same keys. Group, tags and description only
dress the built assets."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagster import AssetKey, AssetsDefinition, AssetSpec, Definitions, SourceAsset

from icecdc_dagster.assets import naming
from icecdc_dagster.config import PipelineConfig, load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.errors import ConfigError

# What a translation may change; anything else (deps, partitions, automation, ...) is ours to keep.
_TRANSLATABLE = ("key", "group_name", "tags", "description")
COMPONENT_TYPE = "icecdc_dagster.IcecdcComponent"


@dataclass(frozen=True)
class IcecdcAsset:
    """One asset as a translation sees it: ``{{ kind }}`` (source, changelog, replica, opensearch,
    maintenance, ingest, dead_letters), ``{{ table_name }}``, ``{{ namespace }}``, ``{{ table }}``,
    ``{{ target }}`` (a sink's index or replica table, an ingest entry's target), ``{{ ingest }}``
    (an ingest entry's name), and ``{{ spec }}`` (the asset as we would build it)."""

    kind: str
    key: AssetKey
    names: Mapping[str, str] = field(default_factory=dict)

    def template_vars(self) -> dict[str, Any]:
        return {"kind": self.kind, "asset": self, **self.names}


Translation = Callable[[AssetSpec, IcecdcAsset], AssetSpec]


def icecdc_definitions(pipeline: str | Path | PipelineConfig, translation: Translation | None = None,
                       check_tables: bool = True) -> Definitions:
    """Our assets, checks, sensors, schedules and resources for a user's ``Definitions`` (plain Python):
    the pipeline file at ``pipeline`` (watched by the warm launcher like ``$ICECDC_CONFIG``) or a
    config built in code, each asset's key, group, tags and description passed through ``translation``.

    No code-location-wide executor (our jobs carry theirs) and resource keys prefixed ``icecdc_``, so
    ``Definitions.merge`` with the user's own definitions changes nothing of theirs.

    Raises:
        ConfigError: the pipeline is refused, a translation changes what it may not, or two assets get one key.
    """
    config = pipeline if isinstance(pipeline, PipelineConfig) else load_config(pipeline)
    translated, styles = translate(config, translation)
    return restyle(build_definitions(translated, check_tables=check_tables), styles)


def translate(config: PipelineConfig,
              translation: Translation | None) -> tuple[PipelineConfig, dict[AssetKey, dict[str, Any]]]:
    """A copy of ``config`` whose assets carry the keys ``translation`` chose, and what else it changed
    (group, tags, description) by the asset's final key."""
    config = config.model_copy(deep=True)
    assets = naming.named_assets(config)
    for asset in assets:
        asset.keyed.forget_translated_keys()
    styles: dict[AssetKey, dict[str, Any]] = {}
    if translation is None:
        return config, styles
    for asset in naming.named_assets(config):
        base = AssetSpec(key=asset.key, group_name=asset.group)
        spec = translation(base, IcecdcAsset(asset.kind, asset.key, dict(asset.names)))
        _refuse_other_changes(config, asset, base, spec)
        if spec.key != asset.key:
            asset.keyed.translate_key(asset.kind, tuple(spec.key.path))
        changed = {"group_name": spec.group_name if spec.group_name != base.group_name else None,
                   "tags": dict(spec.tags) or None, "description": spec.description}
        styles[spec.key] = {k: v for k, v in changed.items() if v is not None}
    return config, styles


def _refuse_other_changes(config: PipelineConfig, asset: naming.NamedAsset, base: AssetSpec, spec: AssetSpec) -> None:
    for name in ("deps", "metadata", "owners", "kinds", "partitions_def", "automation_condition", "code_version",
                 "skippable", "legacy_freshness_policy"):
        if getattr(spec, name, None) != getattr(base, name, None):
            raise ConfigError(f"{config.source}: translation of {asset.where} ({asset.kind}) changes {name!r}; "
                              f"a translation may change {', '.join(_TRANSLATABLE)} (and key_prefix)")


def restyle(defs: Definitions, styles: Mapping[AssetKey, Mapping[str, Any]]) -> Definitions:
    """``defs`` with each asset's translated group, tags and description (keys are already final)."""
    if not any(styles.values()):
        return defs
    assets: list[Any] = []
    for asset in defs.assets or []:
        if isinstance(asset, SourceAsset):
            assets.append(_restyled_source(asset, styles.get(asset.key, {})))
        elif isinstance(asset, (AssetsDefinition, AssetSpec)):
            assets.append(_restyled(asset, styles))
        else:
            assets.append(asset)
    return Definitions(assets=assets, asset_checks=defs.asset_checks, sensors=defs.sensors,
                       schedules=defs.schedules, jobs=defs.jobs, resources=defs.resources)


def _dressed(spec: AssetSpec, style: Mapping[str, Any]) -> AssetSpec:
    spec = spec.replace_attributes(**{k: v for k, v in style.items() if k in ("group_name", "description")})
    return spec.merge_attributes(tags=style["tags"]) if style.get("tags") else spec


def _restyled(asset: AssetsDefinition | AssetSpec,
              styles: Mapping[AssetKey, Mapping[str, Any]]) -> AssetsDefinition | AssetSpec:
    if isinstance(asset, AssetSpec):
        return _dressed(asset, styles.get(asset.key, {}))
    return asset.map_asset_specs(lambda spec: _dressed(spec, styles.get(spec.key, {})))


def _restyled_source(asset: SourceAsset, style: Mapping[str, Any]) -> SourceAsset:
    """An observable source asset (Dagster's ``SourceAsset.with_attributes`` changes only its group)."""
    if not style:
        return asset
    return SourceAsset.dagster_internal_init(
        key=asset.key, metadata=asset.raw_metadata, io_manager_key=asset.io_manager_key,
        io_manager_def=asset.io_manager_def, description=style.get("description", asset.description),
        partitions_def=asset.partitions_def, group_name=style.get("group_name", asset.group_name),
        resource_defs=asset.resource_defs, observe_fn=asset.observe_fn,
        auto_observe_interval_minutes=asset.auto_observe_interval_minutes,
        tags={**(asset.tags or {}), **style.get("tags", {})}, legacy_freshness_policy=asset.legacy_freshness_policy,
        op_tags=asset.op_tags, automation_condition=asset.automation_condition,
        _required_resource_keys=asset._required_resource_keys)


__all__ = ["COMPONENT_TYPE", "IcecdcAsset", "Translation", "icecdc_definitions", "restyle", "translate"]
