"""The index users query is an alias over versioned indexes: ``<index>`` -> ``<index>_v<n>``.

Why: a change the documents cannot take in place (a renamed or dropped column, a type change, a
resync) is built into a new version while readers keep querying the complete old one; one
``_aliases`` call then moves the alias (remove + add, atomic on the cluster) and the old version
is dropped. Readers never see a half-built index, never a missing one.

Each version carries, in its mapping ``_meta.icecdc.index_version``, what it was built for:
``{number, schema (field id -> name/type, see :mod:`.evolution`), snapshot_id, line, reason,
started_at_ms}``; its checkpoint sits beside it (:mod:`.checkpoint`), so a version's documents,
checkpoint and schema can only disappear together, and the alias names the sink's checkpoint.

A deployment from before versions has a plain index named ``<index>``; it is migrated once, by
name, when the sink next applies a batch: ``<index>_v1`` is built like any new version, then one
``_aliases`` call removes the plain index (``remove_index``) and adds the alias of the same name:
no moment without an index under that name. Only the public OpenSearch API is used.
"""

import re
import time
from dataclasses import dataclass
from typing import Any

from icecdc_dagster.errors import CheckpointError
from icecdc_dagster.sinks.opensearch.checkpoint import META_KEY, VERSION_KEY, index_mappings


def version_name(alias: str, number: int) -> str:
    return f"{alias}_v{number}"


@dataclass(frozen=True)
class Version:
    """One concrete index behind (or waiting for) the alias; ``number`` 0 is a plain index."""

    name: str
    number: int
    mappings: dict[str, Any]

    @property
    def meta(self) -> dict[str, Any]:
        """What the version was built for (``{}`` for a plain index)."""
        return dict(((self.mappings.get("_meta") or {}).get(META_KEY) or {}).get(VERSION_KEY) or {})


@dataclass(frozen=True)
class Layout:
    """Where the alias stands: its live version (None: nothing yet), whether that is still a plain
    index, and every other version of the alias (a reindex in progress, or leftovers)."""

    alias: str
    live: Version | None
    plain: bool
    others: tuple[Version, ...]

    @property
    def building(self) -> Version | None:
        """The newest version above the live one: a reindex in progress (or one that failed)."""
        floor = self.live.number if self.live is not None else 0
        newer = [v for v in self.others if v.number > floor]
        return max(newer, key=lambda v: v.number) if newer else None

    @property
    def next_number(self) -> int:
        return (self.live.number if self.live is not None else 0) + 1


def read_layout(client: Any, alias: str) -> Layout:
    """The alias's versions, read with the public API (a wildcard get_mapping, get_alias)."""
    from opensearchpy.exceptions import NotFoundError  # opensearch-py: ~1.2 s, its sink only

    pattern = re.compile(rf"^{re.escape(alias)}_v(\d+)$")
    found = client.indices.get_mapping(index=f"{alias}_v*", allow_no_indices=True)
    versions = {name: Version(name, int(m.group(1)), body.get("mappings") or {})
                for name, body in found.items() if (m := pattern.match(name))}
    try:
        aliased = sorted(client.indices.get_alias(name=alias))
    except NotFoundError:
        aliased = []
    if len(aliased) > 1:
        raise CheckpointError(f"alias {alias} names {aliased}; the sink keeps it on exactly one index")
    if aliased:
        live = versions.get(aliased[0])
        if live is None:  # an alias we did not make: show it as a version without a number
            live = Version(aliased[0], 0, index_mappings(client, aliased[0]) or {})
        return Layout(alias, live, False, tuple(v for v in versions.values() if v.name != live.name))
    plain = index_mappings(client, alias)
    live = Version(alias, 0, plain) if plain is not None else None
    return Layout(alias, live, plain is not None, tuple(versions.values()))


def build_meta(number: int, schema: dict[str, Any], snapshot_id: int | None, line: str | None,
               reason: str) -> dict[str, Any]:
    return {"number": number, "schema": schema, "snapshot_id": None if snapshot_id is None else str(snapshot_id),
            "line": line, "reason": reason, "started_at_ms": int(time.time() * 1000)}


def create_version(client: Any, alias: str, number: int, mappings: dict[str, Any], settings: dict[str, Any] | None,
                   meta: dict[str, Any], with_alias: bool) -> str:
    """Create ``<alias>_v<number>`` with ``meta`` in its ``_meta``; ``with_alias``: the alias names it
    at once (the very first version, when there is nothing to keep readers on)."""
    body: dict[str, Any] = {"mappings": {**mappings, "_meta": {**(mappings.get("_meta") or {}),
                                                                META_KEY: {VERSION_KEY: meta}}}}
    if settings:
        body["settings"] = settings
    if with_alias:
        body["aliases"] = {alias: {}}
    name = version_name(alias, number)
    client.indices.create(index=name, body=body)
    return name


def swap(client: Any, layout: Layout, new: str) -> None:
    """Move the alias to ``new`` in one ``_aliases`` call, then drop the old version.

    The alias must still name what ``layout`` saw: a concurrent writer that moved it is refused,
    not overwritten. A plain index is removed by the same call that adds the alias of its name."""
    current = read_layout(client, layout.alias).live
    if _identity(current) != _identity(layout.live):
        raise CheckpointError(f"alias {layout.alias} moved from {_identity(layout.live)[0]} to "
                              f"{_identity(current)[0]} (or its checkpoint did) while {new} was built; "
                              f"not moving it")
    actions: list[dict[str, Any]] = [{"add": {"index": new, "alias": layout.alias}}]
    if layout.live is not None and layout.plain:
        actions.append({"remove_index": {"index": layout.live.name}})
    elif layout.live is not None:
        actions.insert(0, {"remove": {"index": layout.live.name, "alias": layout.alias}})
    client.indices.update_aliases(body={"actions": actions})
    if layout.live is not None and not layout.plain and layout.live.number > 0:
        drop(client, layout.live.name)  # an index aliased by hand (no version number) is left alone


def _identity(version: Version | None) -> tuple[str | None, Any]:
    """What must not change under a build: the live index and its ``_meta`` (checkpoints)."""
    return (None, None) if version is None else (version.name, version.mappings.get("_meta"))


def describe(layout: Layout, building_checkpoint: Any = None) -> str:
    """``index items -> items_v2``, a plain index, and any reindex in progress (for status)."""
    live = layout.live
    if live is None:
        text = f"index {layout.alias}: not created yet"
    elif layout.plain:
        text = (f"index {layout.alias}: plain index (migrated to alias {layout.alias} -> "
                f"{version_name(layout.alias, 1)} by the next batch)")
    else:
        text = f"index {layout.alias} -> {live.name}"
    building = layout.building
    if building is not None:
        meta = building.meta
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(int(meta.get("started_at_ms") or 0) / 1000))
        at = (f"built to snapshot {building_checkpoint.snapshot_id}, alias not moved yet"
              if building_checkpoint is not None else "filling")
        text += (f"; REINDEX in progress: {building.name} for snapshot {meta.get('snapshot_id')} "
                 f"({meta.get('reason')}), since {since}, {at}")
    return text


def drop(client: Any, name: str) -> None:
    """Delete a concrete index (never an alias: OpenSearch refuses that by name anyway)."""
    from opensearchpy.exceptions import NotFoundError  # opensearch-py: ~1.2 s, its sink only

    try:
        client.indices.delete(index=name)
    except NotFoundError:
        pass
