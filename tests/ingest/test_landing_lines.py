"""Spark's text reader (``landing_lines``) gives exactly the lines of the byte-range reader, whatever the split
size: its position keys order each file's lines as the file does (the last image per key depends on it), and
``line_numbers`` turns them into the lines' numbers (what a dead letter names)."""

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from icecdc_dagster.errors import HiddenLandingFileError
from icecdc_dagster.ingest import landing, landing_lines

# Lines as landing files hold them: JSON, empty, a \r before the \n, bytes that are not UTF-8, long lines
# that span several splits, multi-byte characters.
pieces = st.one_of(st.just(b""), st.just(b'{"a": 1}\r'), st.just(b'{"a": "x\xff\xe2\x82y"}'),
                   st.binary(min_size=1, max_size=40).map(lambda b: b.replace(b"\n", b"")),
                   st.integers(300, 3000).map(lambda n: b"x" * n),
                   st.text(max_size=30).map(lambda t: t.replace("\n", " ").encode()))
files = st.lists(st.tuples(st.lists(pieces, max_size=40), st.booleans()), min_size=1, max_size=3)


def _expected(described: list[landing.LandingFile]) -> list[tuple[int, str, int, str]]:
    return [(index, f.uri, n + 1, raw.decode("utf-8", errors="replace")) for index, f in enumerate(described)
            for n, (_, raw) in enumerate(landing.read_line_bytes(f.uri, 0, f.size))]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(contents=files, split_bytes=st.sampled_from([256, 1024, 1 << 20]))
def test_lines_and_numbers_equal_the_byte_range_reader(spark, tmp_path, contents, split_bytes):
    folder = tmp_path / uuid.uuid4().hex
    folder.mkdir()
    paths = []
    for i, (lines, trailing_newline) in enumerate(contents):
        path = folder / f"events[{i}]*.json"  # glob characters: a landing file's name is a path, not a pattern
        path.write_bytes(b"\n".join(lines) + (b"\n" if trailing_newline and lines else b""))
        paths.append(str(path))
    described = landing.describe(paths)
    prior = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(split_bytes))
    try:
        read = landing_lines.lines(spark, described)
        keyed = [tuple(r) for r in read.collect()]
        numbered = [tuple(r) for r in landing_lines.line_numbers(spark, described, read).collect()]
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", prior)
    expected = _expected(described)
    assert sorted(numbered) == expected
    in_key_order = sorted(keyed)  # (file, key): each file's lines in the order its keys give
    assert [(i, uri, raw) for i, uri, _, raw in in_key_order] == [(i, uri, raw) for i, uri, _, raw in expected]
    assert len({(i, key) for i, _, key, _ in keyed}) == len(keyed)  # strictly increasing: no two lines tie
    assert all(0 <= key <= f.size for i, _, key, _ in keyed for f in [described[i]])  # fits as an offset did


def test_a_file_named_like_a_writer_in_progress_is_refused_not_read_as_empty(spark, tmp_path):
    for name in ("_partial.json", ".partial.json"):
        path = tmp_path / name
        path.write_text('{"op": "c", "after": {"id": 1}}\n')
        with pytest.raises(HiddenLandingFileError, match=name):  # Spark's reader would skip it silently
            landing_lines.lines(spark, landing.describe([str(path)]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(pieces, max_size=30), trailing_newline=st.booleans(), data=st.data())
def test_a_byte_range_yields_exactly_the_lines_that_start_in_it(tmp_path, lines, trailing_newline, data):
    """``read_line_bytes(uri, start, end)`` (the schema-block sample reads a file's first 64 KB this way): each
    line starting in [start, end), whole even where it runs past ``end``, with its offset; nothing else."""
    content = b"\n".join(lines) + (b"\n" if trailing_newline and lines else b"")
    path = tmp_path / f"{uuid.uuid4().hex}.json"
    path.write_bytes(content)
    start = data.draw(st.integers(0, len(content)))
    end = data.draw(st.integers(start, len(content) + 2))
    starts = [0] + [i + 1 for i, b in enumerate(content) if b == ord("\n") and i + 1 < len(content)]
    expected = [(s, content[s:].split(b"\n", 1)[0]) for s in starts if start <= s < end] if content else []
    assert list(landing.read_line_bytes(str(path), start, end)) == expected
