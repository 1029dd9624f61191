"""What a batch's materialisation records about its line: each key written and read here only."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dagster import AssetMaterialization

LINE = "line"  # the resync key of the line the batch belongs to (absent: the original line)
SOURCE_UUID = "source_table_uuid"  # changelog batches: the table uuid the batch was computed from


def plain(value: Any) -> Any:
    """A metadata value as written: a stored ``MetadataValue`` unwrapped (``MetadataValue.path(p)`` -> p)."""
    return getattr(value, "value", value)


def recorded(materialization: "AssetMaterialization | None", key: str) -> Any:
    """The plain value a materialisation recorded under ``key`` (None: no materialisation, or no such key)."""
    if materialization is None:
        return None
    return plain(materialization.metadata.get(key))


def recorded_text(materialization: "AssetMaterialization | None", key: str) -> str | None:
    value = recorded(materialization, key)
    return str(value) if value is not None else None


def recorded_line(materialization: "AssetMaterialization | None") -> str | None:
    """The line a batch recorded: its resync key, None for the original line."""
    return recorded_text(materialization, LINE)


def line_metadata(line: str | None) -> dict[str, str]:
    """The metadata that records a batch's line (nothing for the original line)."""
    return {LINE: line} if line is not None else {}
