"""Property-based differential test of ingestion (issue 10, "make the classes impossible").

Random keyed Debezium streams (c/r/u/d) with values at the type limits (int64/int32 bounds, decimals
near 38 digits), delivered at least once (the consumer restarts from an earlier offset: a run of
already-delivered events is delivered again, in order), cut into landing files at random, with
copied files and re-executed batches, are ingested through the real pipeline into a real Iceberg
table. The oracle is a tiny independent model: the last image per key wins, deletes remove, an
event whose value does not fit its column is a dead letter (and changes nothing); a replay must
give the same table as a single delivery.
"""

import base64
import json
import uuid
from collections import Counter
from decimal import Context, Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from icecdc_dagster.ingest import IngestSettings, ingest_files

INT32, INT64 = 2**31, 2**63
SCALE = 4
FIELDS = [{"type": "int64", "optional": False, "field": "id"}, {"type": "int64", "optional": True, "field": "n"},
          {"type": "int32", "optional": True, "field": "small"},
          {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
           "parameters": {"scale": str(SCALE), "connect.decimal.precision": "38"}, "field": "amount"},
          {"type": "string", "optional": True, "field": "label"}]
SCHEMA = {"type": "struct", "name": "srv.shop.items.Envelope", "fields": [
    {"type": "struct", "optional": True, "name": "srv.shop.items.Value", "fields": FIELDS, "field": side}
    for side in ("before", "after")] + [{"type": "string", "optional": False, "field": "op"}]}


def _b64(unscaled: int) -> str:
    return base64.b64encode(unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)).decode()


# unscaled decimal(38,4) values: up to 38 digits fit, 39 digits (35 integer digits) never fit (38 is the cap)
unscaled = st.one_of(st.integers(-(10**38) + 1, 10**38 - 1), st.integers(10**38, 10**39 - 1),
                     st.sampled_from([0, 1, -1, 10**38 - 1, -(10**38) + 1, 10**38]))
small = st.one_of(st.integers(-INT32, INT32 - 1), st.sampled_from([-INT32, INT32 - 1, INT32, -INT32 - 1, 2**40]))
images = st.fixed_dictionaries({
    "id": st.integers(1, 5),
    "n": st.one_of(st.none(), st.integers(-INT64, INT64 - 1), st.sampled_from([-INT64, INT64 - 1])),
    "small": st.one_of(st.none(), small),
    "amount": st.one_of(st.none(), unscaled),
    "label": st.one_of(st.none(), st.text(max_size=5)),
})
events = st.lists(st.tuples(st.sampled_from("cruud"), images), min_size=1, max_size=14)


def _line(op, image):
    wire = {**image, "amount": None if image["amount"] is None else _b64(image["amount"])}
    before, after = (wire, None) if op == "d" else (None, wire)
    return json.dumps({"schema": SCHEMA, "payload": {"op": op, "before": before, "after": after}})


def _fits(op, image, evolve):
    """Independent statement of what fits: deletes match on the key only."""
    if op == "d":
        return True
    small_ok = image["small"] is None or -INT32 <= image["small"] < INT32 or evolve
    return small_ok and (image["amount"] is None or abs(image["amount"]) < 10**38)


def _model(stream, evolve):
    table = {}
    for op, image in stream:
        if not _fits(op, image, evolve):
            continue
        if op == "d":
            table.pop(image["id"], None)
        else:
            amount = None if image["amount"] is None else Decimal(image["amount"]).scaleb(-SCALE, Context(prec=50))
            table[image["id"]] = (image["n"], image["small"], amount, image["label"])
    return table


@st.composite
def deliveries(draw):
    """(original stream, delivered stream as indices into it, landing files as runs of it, schema evolution)."""
    stream = draw(events)
    delivered = list(range(len(stream)))
    for _ in range(draw(st.integers(0, 2))):         # at-least-once: replay a run that was delivered already
        at = draw(st.integers(1, len(delivered)))
        start = draw(st.integers(0, at - 1))
        delivered[at:at] = delivered[start:at]
    cuts = sorted(set(draw(st.lists(st.integers(1, max(len(delivered) - 1, 1)), max_size=2))))
    bounds = [0, *[c for c in cuts if c < len(delivered)], len(delivered)]
    files = [delivered[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]
    if draw(st.booleans()):                           # a copied landing file right after its original
        i = draw(st.integers(0, len(files) - 1))
        files.insert(i + 1, list(files[i]))
    return stream, delivered, files, draw(st.booleans())


def _check(spark, catalog, cat, tmp_path, case):
    stream, delivered, files, evolve = case
    events_ = [(op, image) for op, image in stream]
    assert _model([events_[i] for i in delivered], evolve) == _model(events_, evolve)   # the replay property itself
    name = "p" + uuid.uuid4().hex[:8]
    landing = tmp_path / name
    landing.mkdir()
    paths = []
    for k, indices in enumerate(files):
        path = landing / f"{k:03d}.json"
        path.write_text("\n".join(_line(*events_[i]) for i in indices) + "\n")
        paths.append(str(path))
    settings_ = IngestSettings(landing=str(landing), target=f"db.{name}", identifier_columns=("id",),
                               auto_create=True, schema_evolution=evolve)
    for path in paths:
        assert not ingest_files(spark, cat, catalog, settings_, [path]).skipped
    assert ingest_files(spark, cat, catalog, settings_, [paths[-1]]).skipped   # a re-executed batch: no-op
    expected = _model(events_, evolve)
    if catalog.table_exists(f"db.{name}"):
        got = {r.id: (r.n, r.small, r.amount, r.label) for r in spark.table(f"{cat}.db.{name}").collect()}
    else:
        got = {}
    assert got == expected
    bad = Counter(_line(*events_[i]) for indices in files for i in indices if not _fits(*events_[i], evolve))
    dead = Counter(r.raw for r in spark.table(f"{cat}.db.{name}__dead_letters").collect()) \
        if catalog.table_exists(f"db.{name}__dead_letters") else Counter()
    assert dead == bad


@settings(max_examples=3, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=deliveries())
def test_ingestion_matches_the_model(spark, catalog, catalog_settings, tmp_path, case):
    _check(spark, catalog, catalog_settings.name, tmp_path, case)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=deliveries())
def test_ingestion_matches_the_model_deep(spark, catalog, catalog_settings, tmp_path, case):
    _check(spark, catalog, catalog_settings.name, tmp_path, case)
