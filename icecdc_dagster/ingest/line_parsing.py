"""What each line (or stream message) says: its target, its operation and field types, a tombstone, or the
reason it is a dead letter. Executor functions: the driver sees none of the lines."""

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql import types as T

from icecdc_dagster.ingest import routing
from icecdc_dagster.ingest.columns import TOMBSTONE
from icecdc_dagster.ingest.debezium import EventError, loads, parse_line

if TYPE_CHECKING:
    from pyspark.sql import Row


# A line's order within its batch: file index * ORDER_FILE_SHIFT + its position in the file.
ORDER_FILE_SHIFT = 1 << 40
PARSED_SCHEMA = T.StructType([
    T.StructField("file_index", T.LongType()), T.StructField("source_file", T.StringType()),
    T.StructField("source_offset", T.LongType()), T.StructField("raw", T.StringType()),
    T.StructField("target", T.StringType()), T.StructField("op", T.StringType()),
    T.StructField("reason", T.StringType()),
    # (name, Iceberg type) in the envelope's field order: a list, since a map would lose that order
    T.StructField("field_types", T.ArrayType(T.StructType([T.StructField("name", T.StringType()),
                                                           T.StructField("type", T.StringType())])))])


def parse_records(target: str, home: str) -> Callable[[Iterable["Row"]], Iterator[tuple[Any, ...]]]:
    """Executor function: a stream batch's messages (rows of ``native.LINE_SCHEMA``) -> parsed rows, by the
    same per-line rules as landing lines (:func:`line_parser`)."""
    parse = line_parser(target, home)

    def run(rows: Iterable["Row"]) -> Iterator[tuple[Any, ...]]:
        for row in rows:
            yield parse(row.file_index, row.source_file, row.source_offset, row.raw)
    return run


def line_parser(target: str, home: str) -> Callable[[int, str, int, str], tuple[Any, ...]]:
    """One line (or message) -> its parsed row: routed, with field types, a tombstone, or a dead-letter reason."""
    templated = routing.is_template(target)

    def parse(file_index: int, uri: str, offset: int, line: str) -> tuple[Any, ...]:
        routed = target
        try:
            env = parse_line(line)
            if env is None:
                return (file_index, uri, offset, None, home, TOMBSTONE, None, None)
            if templated:
                routed = routing.route(target, env.payload)
            return (file_index, uri, offset, line, routed, env.op, None, list(env.field_types.items()))
        except EventError as exc:
            if templated:
                routed = home
                try:
                    doc = loads(line)
                    routed = routing.route(target, doc.get("payload") or doc)
                except Exception:  # noqa: BLE001 - unroutable: stays in the home table
                    pass
            return (file_index, uri, offset, line, routed, None, str(exc), None)
    return parse
