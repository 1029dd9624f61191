"""Field types of the pipeline file: secrets from the environment, ISO-8601 durations, table names.

Each type validates strictly (a string is never silently a boolean, a number never silently a
string) and documents itself in the generated JSON schema. Paths relative to the pipeline file
are resolved against the directory given as ``base_dir`` in the validation context.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    StrictBool,
    StrictInt,
    ValidationInfo,
    WithJsonSchema,
)

_DURATION = re.compile(
    r"^P(?:(?P<days>\d+(?:\.\d+)?)D)?(?:T(?:(?P<hours>\d+(?:\.\d+)?)H)?"
    r"(?:(?P<minutes>\d+(?:\.\d+)?)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?$")
TABLE_NAME_PATTERN = r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+$"
_TABLE_NAME = re.compile(TABLE_NAME_PATTERN)


class Model(BaseModel):
    """Every section of the pipeline file: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_duration(text: str) -> float:
    """ISO-8601 duration (``PT30S``, ``PT5M``, ``P1DT2H``) in seconds."""
    match = _DURATION.match(str(text).strip())
    if not match or text in ("P", "PT") or str(text).endswith("T"):
        raise ValueError(f"{text!r} is not an ISO-8601 duration like PT30S")
    parts = {k: float(v) for k, v in match.groupdict().items() if v}
    if not parts:
        raise ValueError(f"{text!r} is not an ISO-8601 duration like PT30S")
    return (parts.get("days", 0) * 86400 + parts.get("hours", 0) * 3600
            + parts.get("minutes", 0) * 60 + parts.get("seconds", 0))


def _duration(value: str) -> str:
    parse_duration(value)
    return value


Duration = Annotated[str, Field(strict=True), AfterValidator(_duration),
                     WithJsonSchema({"type": "string", "format": "duration",
                                     "description": "ISO-8601 duration, e.g. PT30S, PT5M, P7D"})]
"""An ISO-8601 duration kept as written; ``parse_duration`` gives seconds."""


@dataclass(frozen=True)
class EnvRef:
    """A value taken from an environment variable when it is used, never stored."""

    name: str

    def resolve(self) -> str | None:
        return os.environ.get(self.name)


_ENV_SCHEMA = {"type": "object", "properties": {"env": {"type": "string"}}, "required": ["env"],
               "additionalProperties": False, "description": "read from this environment variable at run time"}


def _env_ref(value: Any) -> EnvRef:
    if isinstance(value, EnvRef):
        return value
    if isinstance(value, dict) and set(value) == {"env"} and isinstance(value["env"], str) and value["env"]:
        return EnvRef(value["env"])
    raise ValueError("secrets must come from the environment: write {env: VARIABLE_NAME}")


def _env_or_text(value: Any) -> EnvRef | str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        if set(value) != {"env"} or not isinstance(value["env"], str):
            raise ValueError("expected a string or {env: VARIABLE_NAME}")
        return EnvRef(value["env"])
    return _env_ref(value)


Secret = Annotated[EnvRef, PlainValidator(_env_ref), WithJsonSchema(_ENV_SCHEMA)]
"""A password or token: only ``{env: VARIABLE}`` is accepted, so no secret is ever written in the file."""

EnvOrText = Annotated[EnvRef | str, PlainValidator(_env_or_text),
                      WithJsonSchema({"anyOf": [{"type": "string"}, _ENV_SCHEMA]})]
"""A value that may be written plainly or read from the environment (a user name)."""

# Catalog properties that hold a secret (both engines' names; matched lower-case): they are refused
# unless written {env: VARIABLE}, like every password of the file.
SECRET_PROPERTIES = ("token", "credential", "header.authorization")
SECRET_PROPERTY_SUFFIXES = ("secret", "secret-access-key", "session-token", "password", "sas-token")


def is_secret_property(name: str) -> bool:
    lowered = name.lower()
    return lowered in SECRET_PROPERTIES or lowered.endswith(SECRET_PROPERTY_SUFFIXES)


def _property_value(value: Any) -> EnvRef | str:
    if isinstance(value, (dict, EnvRef)):
        return _env_ref(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise ValueError("expected a string, number, boolean or {env: VARIABLE}")


PropertyValue = Annotated[EnvRef | str, PlainValidator(_property_value),
                          WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"},
                                                    _ENV_SCHEMA]})]
"""A catalog property: written plainly (kept as text; booleans as ``true``/``false``) or ``{env: VARIABLE}``."""


def is_table_name(text: str) -> bool:
    """``<namespace>.<table>`` (namespaces may nest)."""
    return bool(_TABLE_NAME.match(text))


def _table_name(value: str) -> str:
    if not is_table_name(value):
        raise ValueError("expected <namespace>.<table>")
    return value


TableName = Annotated[str, Field(strict=True, json_schema_extra={"pattern": TABLE_NAME_PATTERN}),
                      AfterValidator(_table_name)]

PositiveInt = Annotated[StrictInt, Field(ge=1)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0)]
PositiveSeconds = Annotated[float, Field(gt=0, strict=False)]
Flag = StrictBool


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


Names = Annotated[tuple[Annotated[str, Field(strict=True, min_length=1)], ...], BeforeValidator(_one_or_many)]
"""Column names: a list, or one name written alone (``identifier_columns: id``)."""


def _key_path(value: Any) -> Any:
    return value.split("/") if isinstance(value, str) else value


AssetKeyPath = Annotated[tuple[Annotated[str, Field(strict=True, min_length=1)], ...], BeforeValidator(_key_path),
                         Field(min_length=1)]
"""A Dagster asset key: its path as a list (``[demo_replica, orders]``) or one string ``demo_replica/orders``."""


class Keyed(Model):
    """A config object that names assets (a table, a sink, an ingest entry): the keys a translation chose
    for them (a Component's ``translation``), by asset kind. Set once when definitions are built from a
    copy of the config, so the sensors, checks, lines and ``icecdc sync`` that read the same copy agree."""

    _translated_keys: dict[str, tuple[str, ...]] = PrivateAttr(default_factory=dict)

    def translated_key(self, kind: str) -> tuple[str, ...] | None:
        return self._translated_keys.get(kind)

    def translate_key(self, kind: str, path: tuple[str, ...]) -> None:
        self._translated_keys[kind] = path

    def forget_translated_keys(self) -> None:
        self._translated_keys.clear()


def local_path(value: str, info: ValidationInfo) -> str:
    """Relative warehouse paths and SQLite files are relative to the pipeline file; a model built in
    code (no file, no ``base_dir``) keeps what it was given."""
    if not info.context or "base_dir" not in info.context:
        return value
    base = Path(info.context["base_dir"])
    if value.startswith("sqlite:///") and not value.startswith("sqlite:////"):
        return "sqlite:///" + str((base / value[len("sqlite:///"):]).resolve())
    if "://" not in value:
        return "file://" + str((base / value).resolve())
    return value


LocationOrUri = Annotated[str, Field(strict=True), AfterValidator(local_path)]
"""A URI (``s3://``, ``postgresql://``, ``file://``) or a path relative to the pipeline file."""
