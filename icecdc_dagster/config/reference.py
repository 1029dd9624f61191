"""``docs/configuration.md``: the pipeline file's reference, generated from the model's JSON schema
(``icecdc config-schema --markdown``), so the documentation cannot drift from what loads."""

import json
from typing import Any

from icecdc_dagster.config.load import config_schema
from icecdc_dagster.inputs.registry import INPUT_KINDS
from icecdc_dagster.sinks.registry import SINK_KINDS

_SECTIONS = (("catalog", "CatalogConfig"), ("spark", "SparkConfig"), ("tables[]", "TableConfig"),
             *((f"tables[].sinks[].{kind}", config.__name__) for kind, config in SINK_KINDS.items()),
             ("ingest[]", "IngestConfig"),
             *((f"ingest[].input.{kind}", config.__name__) for kind, config in INPUT_KINDS.items()),
             ("lineage", "LineageConfig"), ("instance", "InstanceConfig"))


def markdown_reference() -> str:
    schema = config_schema()
    defs = schema["$defs"]
    out = ["# Pipeline file reference", "",
           "Generated from the model (`icecdc config-schema --markdown`; the JSON schema: `icecdc config-schema`).",
           "Unknown keys are errors. Secrets are written `{env: VARIABLE}` and read when used. Durations are",
           "ISO-8601 (`PT30S`, `P7D`). Relative paths are relative to the pipeline file.", ""]
    scalars = {key: prop for key, prop in schema["properties"].items() if "description" in prop}
    if scalars:  # the top-level keys that are not sections
        out += ["## top level", "", "| key | type | default | |", "|---|---|---|---|"]
        for key, prop in scalars.items():
            description = prop["description"].replace("|", "\\|")
            out.append(f"| `{key}` | {_type(prop, defs)} | {_default(prop)} | {description} |")
        out.append("")
    for path, name in _SECTIONS:
        model = defs[name]
        out += [f"## `{path}`", "", model.get("description", ""), "", "| key | type | default | |",
                "|---|---|---|---|"]
        required = set(model.get("required", []))
        for key, prop in model["properties"].items():
            default = "required" if key in required else _default(prop)
            description = prop.get("description", "").replace("|", "\\|")
            out.append(f"| `{key}` | {_type(prop, defs)} | {default} | {description} |")
        out.append("")
    return "\n".join(out)


def _default(prop: dict[str, Any]) -> str:
    if "default" not in prop:
        return "{}" if prop.get("type") == "object" else "—"
    return f"`{json.dumps(prop['default'])}`"


def _type(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        if name.endswith("Entry"):
            return "input" if name[:-len("Entry")] in {c.__name__ for c in INPUT_KINDS.values()} else "sink"
        return name
    if "enum" in prop:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    if "anyOf" in prop or "oneOf" in prop:
        kinds = [_type(p, defs) for p in prop.get("anyOf") or prop["oneOf"] if p.get("type") != "null"]
        return " \\| ".join(dict.fromkeys(kinds))
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}), defs)}"
    if kind == "object" and set(prop.get("properties", {})) == {"env"}:
        return "`{env: VAR}`"
    if kind == "object":
        values = prop.get("additionalProperties")
        return f"mapping of {_type(values, defs)}" if isinstance(values, dict) else "mapping"
    if prop.get("format") == "duration":
        return "duration"
    return kind
