"""Debezium lines -> typed table rows inside Spark's job: no Python per event on the common path.

Plain lines are typed by one pass of a streaming JSON parser in the JVM (:mod:`line_typer`,
``LineTyper.java``: each value typed from the token the parser names); lines with schema blocks, and every
line where that class cannot be built, by Spark's own JSON reader (``from_json``) and native expressions. A
line takes the native path only when the native result is provably the value the exact Python rules
(:mod:`debezium`, :mod:`coercion`) would give; anything else — a value that needs a declared rule
(numeric strings, stringified JSON, epoch heuristics beyond the plain cases), a schema block, a value
that does not fit, malformed JSON — is *routed*, not guessed: those lines go through the Python rules,
which give the value or the dead-letter reason. So both paths always agree, and the Python rules are
paid only for the lines that need them.

Why each guard of the expression typing exists (Spark's JSON reader is more lenient than Python's ``json`` in
places):

- number tokens read as text come back re-rendered through a double (``1.10`` -> ``1.1``) and Spark's
  decimal reader rounds to the column's scale silently, so a decimal field is typed natively only when
  the line itself writes it with at most the column's scale in fraction digits and no exponent;
- a JSON integer read as a double is rounded silently above 2^53: such integers go the Python way;
- Spark's decimal reader drops ``,`` from strings (US locale): such strings go the Python way;
- Spark accepts single quotes (turned off here) and ignores text after the first object (``}{``);
- a string column cannot tell ``"5"`` from ``5`` in Spark: numeric-looking text goes the Python way.

Modules: :mod:`line_frames` (landing lines into a Spark frame), :mod:`schema_blocks` (lines with a Connect
schema block: how the Python rules would decode each field), :mod:`column_rules` (one column's native value
and whether it provably equals the Python rules' value), :mod:`line_typer` (the JVM parser's typing of plain
lines), :mod:`line_typing` (a batch's lines typed and flagged native or routed).
"""

from icecdc_dagster.ingest.native.column_rules import TargetColumn, columns_of, utc
from icecdc_dagster.ingest.native.line_frames import LINE_SCHEMA
from icecdc_dagster.ingest.native.line_typing import FAST, JSON_OPTIONS, coerce_lines, split
from icecdc_dagster.ingest.native.schema_blocks import (
    MAX_BRANCHES,
    Decoding,
    FieldDecoding,
    SchemaBranch,
    field_decoding,
    line_branches,
    sample_branches,
    sample_records,
    schema_branch,
)

__all__ = ["FAST", "JSON_OPTIONS", "LINE_SCHEMA", "MAX_BRANCHES", "Decoding", "FieldDecoding", "SchemaBranch",
           "TargetColumn", "coerce_lines", "columns_of", "field_decoding", "line_branches",
           "sample_branches", "sample_records", "schema_branch", "split", "utc"]
