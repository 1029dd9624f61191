"""``IcecdcComponent``: our pipeline as a Dagster Component (``type: icecdc_dagster.IcecdcComponent`` in a
``defs.yaml``), registered for ``dg`` through the ``dagster_dg_cli.registry_modules`` entry point."""

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from dagster import Component, ComponentLoadContext, Definitions, Resolvable
from dagster.components.resolved.context import ResolutionContext
from dagster.components.resolved.model import Resolver
from dagster.components.scaffold.scaffold import Scaffolder, ScaffoldRequest, scaffold_with
from dagster.components.utils.translation import TranslationFn, TranslationFnResolver

from icecdc_dagster.component.translation import COMPONENT_TYPE, IcecdcAsset, icecdc_definitions, translate
from icecdc_dagster.config import PipelineConfig, load_config, parse_config
from icecdc_dagster.config.load import watch
from icecdc_dagster.errors import ConfigError

PIPELINE_FILE = "pipeline.yaml"

_SKELETON = """\
# The icecdc pipeline file: catalog, Spark, the tables to follow and their sinks (reference:
# docs/configuration.md of icecdc_dagster, or `icecdc config-schema`). Relative paths are relative to this file.
catalog:
  name: lake
  uri: sqlite:///lake/catalog.db
  warehouse: lake/warehouse
spark:
  master: local[2]
tables: []
# tables:
#   - table_name: demo.orders
#     identifier_columns: [id]
#     sinks:
#       - iceberg: {table_name: demo_replica.orders, asset_key: [demo_replica, orders]}
"""


@dataclass(frozen=True)
class Pipeline:
    """The component's pipeline, loaded (a plain holder: Dagster's resolution inspects pydantic models)."""

    config: PipelineConfig


def _resolve_pipeline(context: ResolutionContext, model: str | dict[str, Any]) -> Pipeline:
    """A path (relative to the folder of the ``defs.yaml``) or the pipeline written inline."""
    if isinstance(model, str):
        return Pipeline(load_config(context.resolve_source_relative_path(context.resolve_value(model, as_type=str))))
    tree = context.source_position_tree
    source = Path(tree.position.filename) if tree is not None else None
    if source is not None:
        watch(source)
    return Pipeline(parse_config(model, f"{source or '<inline>'}: attributes.pipeline",
                                 source.resolve().parent if source is not None else None))


class IcecdcScaffolder(Scaffolder[Any]):
    """``dg scaffold defs icecdc_dagster.IcecdcComponent <folder>``: a ``defs.yaml`` naming a pipeline file
    beside it, and that file's skeleton (an empty pipeline: ``dg check defs`` passes before any table)."""

    def scaffold(self, request: ScaffoldRequest[Any]) -> None:
        from dagster.components.component_scaffolding import scaffold_component  # dg scaffold only (click)

        scaffold_component(request, {"pipeline": PIPELINE_FILE})
        pipeline = request.target_path / PIPELINE_FILE
        if not pipeline.exists():
            pipeline.write_text(_SKELETON)


@scaffold_with(IcecdcScaffolder)
@dataclass
class IcecdcComponent(Component, Resolvable):
    """Keeps OpenSearch indexes and Iceberg replicas in step with Iceberg tables, snapshot by snapshot, and
    ingests change events into Iceberg: the assets, checks, sensors, maintenance schedules and resources
    of one icecdc pipeline file.

    .. code-block:: yaml

        # defs.yaml
        type: icecdc_dagster.IcecdcComponent
        attributes:
          pipeline: pipeline.yaml
          translation:
            group_name: cdc
            tags: {team: "{{ kind }}"}

    Our resource keys start with ``icecdc_`` and our jobs carry their own executor, so nothing of the
    project's own definitions changes.
    """

    pipeline: Annotated[
        Pipeline,
        Resolver(_resolve_pipeline, model_field_type=str | dict[str, Any],
                 description="The pipeline file (a path relative to this defs.yaml's folder), or the pipeline "
                             "written inline (catalog, spark, tables, ingest, ...).",
                 examples=["pipeline.yaml", {"catalog": {"name": "lake"}, "tables": [{"table_name": "demo.orders"}]}]),
    ]
    translation: Annotated[
        TranslationFn[IcecdcAsset] | None,
        TranslationFnResolver(template_vars_for_translation_fn=lambda asset: asset.template_vars()),
    ] = None

    def build_defs(self, context: ComponentLoadContext) -> Definitions:
        return icecdc_definitions(self.pipeline.config, self.translation)


def load_pipeline(path: str | Path) -> PipelineConfig:
    """What ``icecdc sync``/``status``/``resync`` run on: a pipeline file, or a component's ``defs.yaml``
    (its pipeline, by path or inline, with its translation's keys), so the CLI and the component name
    the same assets.

    Raises:
        ConfigError: see :func:`icecdc_dagster.config.load_config`, and a ``defs.yaml`` of another component.
    """
    file = Path(path)
    try:
        head = yaml.safe_load(file.read_text()) if file.is_file() else None
    except yaml.YAMLError:
        head = None
    if not (isinstance(head, dict) and "type" in head and "attributes" in head):
        return load_config(path)
    if head["type"] != COMPONENT_TYPE:
        raise ConfigError(f"{file}: a defs.yaml of {head['type']!r}, not of {COMPONENT_TYPE}")
    # Resolved as dg resolves it (paths relative to the file, {{ }} templates), without a project tree.
    from dagster_shared.yaml_utils import parse_yaml_with_source_position  # only for a component file

    parsed = parse_yaml_with_source_position(file.read_text(), str(file))
    context = ResolutionContext.default(parsed.source_position_tree.children["attributes"])
    model = IcecdcComponent.model().model_validate(parsed.value["attributes"])
    component = IcecdcComponent.resolve_from_model(context.at_path("attributes"), model)
    return translate(component.pipeline.config, component.translation)[0]
