"""Reading the pipeline file: YAML -> :class:`PipelineConfig`, every mistake named by file and key path.

``ICECDC_CONFIG`` names the file when no path is given; no file at all means an empty pipeline.
"""

import os
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from icecdc_dagster.config.model import PipelineConfig
from icecdc_dagster.errors import ConfigError
from icecdc_dagster.sinks.registry import SINK_KINDS

CONFIG_ENV = "ICECDC_CONFIG"
_ROOT = "<root>"
# Every file this process built a pipeline from: $ICECDC_CONFIG's, a component's pipeline file or its
# defs.yaml (an inline pipeline). The warm launcher rebuilds its cached definitions when one changes.
_WATCHED: set[str] = set()


def watch(path: str | os.PathLike[str]) -> None:
    """Note that definitions are built from ``path`` (see :func:`watched_files`)."""
    _WATCHED.add(str(Path(path).resolve()))


def watched_files() -> frozenset[str]:
    """The pipeline files (and component files) this process has loaded pipelines from."""
    return frozenset(_WATCHED)


def parse_config(data: Any, source: str = "<config>", base_dir: Path | None = None) -> PipelineConfig:
    """Validate parsed YAML; relative paths (SQLite file, warehouse, landing) are relative to ``base_dir``.

    Raises:
        ConfigError: ``data`` is not a mapping, or the model refuses it: every mistake on a line of its own,
            named by ``source`` and the key path (an unknown key lists the keys allowed there).
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {_ROOT}: expected a mapping, got {type(data).__name__}")
    try:
        config = PipelineConfig.model_validate(data, context={"base_dir": base_dir or Path.cwd()})
    except ValidationError as exc:
        lines = list(dict.fromkeys(_describe(error, data) for error in exc.errors()))
        raise ConfigError("\n".join(f"{source}: {line}" for line in _merge_alternatives(lines))) from None
    config._source = source
    return config


def load_config(path: str | os.PathLike[str] | None = None) -> PipelineConfig:
    """Load the pipeline file at ``path``, or ``$ICECDC_CONFIG``; no file means an empty pipeline.

    Raises:
        ConfigError: the file does not exist, is not YAML, or its content is refused (:func:`parse_config`).
    """
    path = path or os.environ.get(CONFIG_ENV)
    if not path:
        return PipelineConfig()
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{file}: pipeline config file not found")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from None
    watch(file)
    return parse_config(data, str(file), file.resolve().parent)


def config_schema() -> dict[str, Any]:
    """The JSON schema of the pipeline file (``icecdc config-schema``)."""
    schema = PipelineConfig.model_json_schema(by_alias=True)
    schema["title"] = "icecdc_dagster pipeline file"
    return schema


def _merge_alternatives(lines: list[str]) -> list[str]:
    """A value that fits none of a union's members is one mistake: its messages on one line."""
    merged: dict[str, list[str]] = {}
    for line in lines:
        path, _, message = line.partition(": ")
        merged.setdefault(path, []).append(message)
    return [f"{path}: {' or '.join(messages)}" if path != _ROOT else " or ".join(messages)
            for path, messages in merged.items()]


def _describe(error: Any, data: Any) -> str:
    loc = tuple(error["loc"])
    value = error.get("input")
    kind = error["type"]
    if kind == "sink_kind" and isinstance(value, dict) and len(value) == 1:
        loc = (*loc, next(iter(value)))
        return f"{_path(loc, data)}: unknown sink type (expected one of: {error['ctx']['expected']})"
    if kind == "sink_kind":
        return (f"{_path(loc, data)}: a sink is one of {error['ctx']['expected']} with its settings, "
                f"e.g. 'opensearch: {{index: x}}'")
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        expected = f" (expected one of: {', '.join(_keys(model))})" if model else ""
        return f"{_path(loc, data)}: unknown key{expected}"
    if kind == "missing":
        return f"{_path(loc[:-1], data)}.{loc[-1]}: missing required key {loc[-1]!r}".replace(f"{_ROOT}.", "")
    if kind in ("bool_type", "bool_parsing"):
        return f"{_path(loc, data)}: expected true or false, got {value!r}"
    message = (error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
               .replace("Input should be", "expected"))
    if kind not in ("value_error", "assertion_error"):
        message = f"{message}, got {value!r}"
    return f"{_path(loc, data)}: {message}"


def _path(loc: tuple[Any, ...], data: Any) -> str:
    """``tables[0] (db.t).sinks[1].opensearch.index``: YAML keys, list positions, and the name of a
    table or ingest entry to find it by."""
    parts: list[str] = []
    node = data
    previous = None
    for item in loc:
        if isinstance(item, int):
            node = node[item] if isinstance(node, list) and item < len(node) else None
            label = f"[{item}]"
            name = node.get("table_name") or node.get("name") if isinstance(node, dict) else None
            if name and isinstance(name, str) and previous in ("tables", "ingest"):
                label += f" ({name})"
            parts[-1] += label
        elif item == previous and previous in SINK_KINDS:
            continue  # a sink's tag and its key are the same YAML key
        elif not isinstance(node, dict):
            continue  # the member of a union a scalar was tried against, not a YAML key
        else:
            node = node.get(item) if isinstance(node, dict) else None
            parts.append(str(item))
        previous = item
    return ".".join(parts) or _ROOT


def _keys(model: type[BaseModel]) -> list[str]:
    return sorted(field.alias or name for name, field in model.model_fields.items())


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that validates the mapping at ``loc`` (for the list of keys it allows)."""
    model: type[BaseModel] | None = PipelineConfig
    keyed = False  # the previous key was a mapping of models (``catalogs``): this item is a name in it
    for item in loc:
        if model is None:
            return None
        if isinstance(item, int) or keyed:
            keyed = False
            continue
        if item in SINK_KINDS and model.__name__.endswith("Entry"):
            model = SINK_KINDS[item]
            continue
        if item in SINK_KINDS and model is not None and "sinks" not in _keys(model):
            model = SINK_KINDS[item]
            continue
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == item), None)
        model = _model_in(field.annotation) if field else None
        keyed = field is not None and get_origin(field.annotation) is dict
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
