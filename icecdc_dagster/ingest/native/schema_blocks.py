"""Lines with a Connect schema block (JsonConverter ``schemas.enable=true``): which lines share a block, and how
the Python rules (:func:`debezium.decode`) would decode each of its fields.

A batch's lines mostly share one schema block (one per topic and schema version). The driver reads the
blocks of a few sample lines, decides per field how the Python rules would decode it, and the lines that
start with exactly that block's text are decoded natively; a line with any other block is routed.
"""

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from icecdc_dagster.ingest import debezium, landing
from icecdc_dagster.ingest import schema_inference as si
from icecdc_dagster.ingest.debezium import Logical

PAYLOAD_KEY = '"payload"'
_JSON_WS = " \t\r\n"
_SCHEMA_OPENING = re.compile(r'^[ \t\r\n]*\{[ \t\r\n]*"schema"[ \t\r\n]*:[ \t\r\n]*')
_SAMPLE_BYTES = 1 << 16
_SAMPLE_LINES = 4
MAX_BRANCHES = 8


class Decoding(Enum):
    """How the Python rules (:func:`debezium.decode`) turn a field's JSON value into a Python value, as far as
    the native reader tells them apart: a logical decoding by its native twin (:func:`column_rules.decoded_value`)."""

    IDENTITY = "identity"                # no schema, or a primitive without a logical decoding: the value as is
    BASE64 = "base64"                    # Connect bytes
    OTHER = "other"                      # anything else (times of day, UUIDs, structs...): the Python rules decide
    # The twins of the logical decodings marked ``native`` in :data:`debezium.LOGICAL_DECODINGS` (found by value).
    DECIMAL = Logical.DECIMAL            # Connect Decimal as bytes: base64 of the big-endian unscaled value
    EPOCH_DAYS = Logical.EPOCH_DAYS      # Date
    EPOCH_MILLIS = Logical.EPOCH_MILLIS  # Timestamp
    EPOCH_MICROS = Logical.EPOCH_MICROS  # MicroTimestamp
    EPOCH_NANOS = Logical.EPOCH_NANOS    # NanoTimestamp
    ZONED = Logical.ZONED                # ZonedTimestamp: ISO-8601 with an offset
    ISO = Logical.ISO                    # IsoTimestamp: ISO-8601, naive meaning UTC


@dataclass(frozen=True)
class FieldDecoding:
    kind: Decoding
    scale: int = 0


@dataclass(frozen=True)
class SchemaBranch:
    """Lines whose text starts with ``prefix`` + ``"payload"``: the same schema block, decoded per side.

    A side is None when its schema makes the Python rules dead-letter every such line (an unknown type)
    or cannot be read here: those lines are routed.
    """

    prefix: str
    before: dict[str, FieldDecoding] | None
    after: dict[str, FieldDecoding] | None


def field_decoding(schema: Any) -> FieldDecoding:
    """The decoding :func:`debezium.decode` applies to a value with this field schema: a logical type's by the
    shared table :data:`debezium.LOGICAL_DECODINGS` (OTHER without a native twin), else by its physical type."""
    if not schema:
        return FieldDecoding(Decoding.IDENTITY)
    name, kind = schema.get("name"), schema.get("type")
    logical = debezium.logical_decoding(name)
    if logical is not None:
        if not logical.native:
            return FieldDecoding(Decoding.OTHER)
        if logical.kind is Logical.DECIMAL:
            return _bytes_decimal_decoding(kind, schema.get("parameters"))
        return FieldDecoding(Decoding(logical.kind))
    if kind == "bytes":
        return FieldDecoding(Decoding.BASE64)
    if kind in si.CONNECT_CONTAINERS or not isinstance(kind, str):
        return FieldDecoding(Decoding.OTHER)
    return FieldDecoding(Decoding.IDENTITY)


def _bytes_decimal_decoding(kind: Any, parameters: Any) -> FieldDecoding:
    """A Connect Decimal is native only as bytes with a readable scale (a number or numeric string: Python rules)."""
    if kind != "bytes":
        return FieldDecoding(Decoding.OTHER)
    try:
        return FieldDecoding(Decoding.DECIMAL, int((parameters or {}).get("scale", 0)))
    except (AttributeError, TypeError, ValueError, ArithmeticError):
        return FieldDecoding(Decoding.OTHER)


def _side_decodings(schema: dict[str, Any], side: str) -> dict[str, FieldDecoding] | None:
    """Field decodings of one image side, as ``debezium.parse_line`` reads them; None when the Python rules
    would dead-letter (or fail on) every line with this side, so they must decide."""
    try:
        image_schema = next((f for f in schema.get("fields", []) if f.get("field") == side), None)
        if not image_schema:
            return {}
        fields = {f["field"]: f for f in image_schema.get("fields", [])}
        for name, f in fields.items():
            si.type_of_connect(f, name)
        return {name: field_decoding(f) for name, f in fields.items()}
    except Exception:  # any failure of the Python rules' own reading: they decide, line by line
        return None


def schema_branch(line: str) -> SchemaBranch | None:
    """The branch of a line written ``{"schema": {...}, "payload": ...}``; None for any other line."""
    if PAYLOAD_KEY not in line:
        return None
    prefix = line.split(PAYLOAD_KEY, 1)[0]
    opening = _SCHEMA_OPENING.match(prefix)
    if opening is None:
        return None
    try:
        schema, end = debezium.JSON_DECODER.raw_decode(prefix, opening.end())
    except ValueError:
        return None  # "payload" inside the block, or no valid block: not a branch
    if debezium.schema_problem(schema) is not None or prefix[end:].strip(_JSON_WS) != ",":
        return None  # not a branch: such lines take the Python rules (a malformed block: a dead letter)
    return SchemaBranch(prefix, _side_decodings(schema, "before"), _side_decodings(schema, "after"))


def sample_branches(files: Sequence[landing.LandingFile]) -> list[SchemaBranch]:
    """Schema branches of the first lines of each file (a block that appears only later is routed)."""
    return line_branches(raw.decode("utf-8", errors="replace") for f in files for _, raw in
                         itertools.islice(landing.read_line_bytes(f.uri, 0, min(f.size, _SAMPLE_BYTES)), _SAMPLE_LINES))


def line_branches(lines: Iterable[str]) -> list[SchemaBranch]:
    """Schema branches of sample lines (landing lines or stream messages), at most ``MAX_BRANCHES``."""
    branches: dict[str, SchemaBranch] = {}
    for line in lines:
        branch = schema_branch(line)
        if branch is not None and branch.prefix not in branches and len(branches) < MAX_BRANCHES:
            branches[branch.prefix] = branch
    return list(branches.values())


def sample_records(records: Sequence[str]) -> list[SchemaBranch]:
    """Schema branches of a stream batch's first messages (as many as a landing file's sample)."""
    return line_branches(itertools.islice(records, _SAMPLE_LINES))
