"""Target table of an event: a fixed name, or a template over envelope fields
(``db.{source.schema}_{source.table}``)."""

import re
from typing import Any

from icecdc_dagster.ingest.debezium import EventError

_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")
_SAFE = re.compile(r"[^A-Za-z0-9_]")


def is_template(target: str) -> bool:
    return bool(_PLACEHOLDER.search(target))


def namespace_of(target: str) -> str:
    """The static namespace of a target or template (everything before the last dot)."""
    static = target.split("{", 1)[0]
    namespace = static.rsplit(".", 1)[0]
    if "." not in static or not namespace:
        raise ValueError(f"target {target!r}: the namespace part must be a fixed name like 'db.'")
    return namespace


def route(target: str, payload: dict[str, Any]) -> str:
    """Render the template with dotted paths into the payload (``source.table``); values made identifier-safe."""
    def value(match: re.Match[str]) -> str:
        node: Any = payload
        for part in match.group(1).strip().split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None or node == "":
            raise EventError(f"cannot route: field {match.group(1)!r} of target template {target!r} is missing")
        return _SAFE.sub("_", str(node)).lower()

    return _PLACEHOLDER.sub(value, target)


def dead_letter_table(target: str) -> str:
    return f"{target}__dead_letters"


def unrouted_dead_letter_table(template: str) -> str:
    """Where events go that cannot be routed (malformed, missing source fields)."""
    return f"{namespace_of(template)}.unrouted__dead_letters"
