"""``docs/component.md``: the Component's attributes and its translation, generated from the models
(``icecdc config-schema --component``), as ``docs/configuration.md`` is from the pipeline file's."""

from typing import Any

from icecdc_dagster.assets import naming
from icecdc_dagster.component.component import IcecdcComponent
from icecdc_dagster.component.translation import COMPONENT_TYPE

_TRANSLATION = ("key", "key_prefix", "group_name", "tags", "description")
_OWN = {"key": "The asset's key: 'a/b' or a list (replaces ours; keys of sources and sinks can also be set by "
               "`asset_key` in the pipeline file)."}
_KINDS = (naming.SOURCE, naming.CHANGELOG, "replica", "opensearch", naming.MAINTENANCE, naming.INGEST,
          naming.DEAD_LETTERS)
_NAMES = (("kind", "the asset's kind: " + ", ".join(_KINDS)),
          ("table_name", "the source table (<namespace>.<table>): source, changelog, sinks, maintenance"),
          ("namespace", "its namespace"), ("table", "its name"),
          ("target", "a sink's index or replica table; an ingest entry's target"),
          ("ingest", "an ingest entry's name (ingest, dead_letters)"),
          ("spec", "the asset as we build it (spec.key, spec.group_name)"))


def _type(schema: dict[str, Any]) -> str:
    options = schema.get("anyOf", [schema])
    return " or ".join("mapping" if o.get("type") == "object" or "$ref" in o else o.get("type", "value")
                       for o in options if o.get("type") != "null")


def component_reference() -> str:
    schema = IcecdcComponent.model().model_json_schema()
    attributes = schema["$defs"]["AssetSpecUpdateKwargsModel"]["properties"]
    lines = ["# The IcecdcComponent: attributes and translation", "",
             "Generated from the component's model by `icecdc config-schema --component`; do not edit by hand.",
             "How to add it to a project: the README's \"Add it to your Dagster project\".", "",
             "```yaml", "# defs/cdc/defs.yaml  (dg scaffold defs icecdc_dagster.IcecdcComponent cdc)",
             f"type: {COMPONENT_TYPE}", "attributes:", "  pipeline: pipeline.yaml",
             "  translation:", "    group_name: cdc", "    tags: {icecdc/kind: \"{{ kind }}\"}", "```", "",
             "## Attributes", "", "| attribute | type | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `pipeline` | {_type(schema['properties']['pipeline'])} | required | "
              f"{schema['properties']['pipeline']['description']} |",
              "| `translation` | mapping | none | Applied to every asset of the pipeline, like dagster-dbt's and "
              "dagster-sling's `translation`: the attributes below, `{{ }}` templates over the names below. |", "",
              "## Translation attributes", "",
              "Anything else (deps, metadata, partitions, automation) is refused at load: it is ours to keep.", "",
              "| attribute | meaning |", "|---|---|"]
    lines += [f"| `{name}` | {attributes[name].get('description') or _OWN.get(name, '')} |" for name in _TRANSLATION]
    lines += ["", "## Names in `{{ }}` templates", "", "| name | value |", "|---|---|"]
    lines += [f"| `{name}` | {meaning} |" for name, meaning in _NAMES]
    lines += ["", "Keys chosen here or by `asset_key` in the pipeline file (a source table's, a sink's) are checked "
              "at load: two assets with one key fail, naming both. `icecdc sync`, `status` and `resync` take the "
              "component's `defs.yaml` as `--config` and use the same keys.", ""]
    return "\n".join(lines)
