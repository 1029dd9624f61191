"""Exact values through the real pipeline (issue 10 #2): 38-digit decimals, no silent NULL, widening or dead letter."""

import base64
import json
from decimal import Context, Decimal

import pytest

from icecdc_dagster.ingest import IngestSettings, ingest_files, pending_files

BIG = Decimal("123456789876543212345678987654321.110")          # 36 digits, scale 3
D10 = Decimal("1234567890123456789012345678.0123456789")        # 38 digits, scale 10


def _b64(d: Decimal, scale: int) -> str:
    n = int(d.scaleb(scale, Context(prec=100)))
    return base64.b64encode(n.to_bytes((n.bit_length() + 8) // 8, "big", signed=True)).decode()


def _decimal_field(name, precision, scale):
    return {"field": name, "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "optional": True,
            "parameters": {"scale": str(scale), "connect.decimal.precision": str(precision)}}


def _envelope(after, fields):
    schema = {"type": "struct", "fields": [{"type": "struct", "field": "after", "optional": True, "fields": fields}]}
    return json.dumps({"schema": schema, "payload": {"op": "c", "after": after}})


def _ingest(spark, catalog, cat, settings):
    return [ingest_files(spark, cat, catalog, settings, [f]) for f in pending_files(spark, cat, settings)]


def test_decimals_are_exact_to_38_digits_and_misfits_dead_letter(spark, catalog, catalog_settings, tmp_path):
    cat = catalog_settings.name
    fields = [{"field": "id", "type": "int32", "optional": False}, _decimal_field("big", 40, 3),
              _decimal_field("d10", 38, 10)]
    landing = tmp_path / "landing"
    landing.mkdir()
    lines = [_envelope({"id": 1, "big": _b64(BIG, 3), "d10": _b64(D10, 10)}, fields),
             _envelope({"id": 2, "big": _b64(-BIG, 3), "d10": _b64(-D10, 10)}, fields),
             _envelope({"id": 3, "big": _b64(BIG, 3), "d10": _b64(BIG, 10)}, fields),        # 43 digits: no fit
             _envelope({"id": 4, "big": _b64(BIG.scaleb(3, Context(prec=100)), 3), "d10": None}, fields)]  # 39 digits
    (landing / "001.json").write_text("\n".join(lines) + "\n")
    settings = IngestSettings(landing=str(landing), target="db.amounts", identifier_columns=("id",),
                              auto_create=True, schema_evolution=True)
    [result] = _ingest(spark, catalog, cat, settings)
    types = {f.name: f.dataType.simpleString() for f in spark.table(f"{cat}.db.amounts").schema.fields}
    assert types == {"id": "int", "big": "decimal(38,3)", "d10": "decimal(38,10)"}
    rows = {r.id: (r.big, r.d10) for r in spark.table(f"{cat}.db.amounts").collect()}
    assert rows == {1: (BIG, D10), 2: (-BIG, -D10)}
    dead = {json.loads(r.raw)["payload"]["after"]["id"]: r.reason
            for r in spark.table(f"{cat}.db.amounts__dead_letters").collect()}
    assert dead.keys() == {3, 4}
    assert "column d10" in dead[3] and "does not fit decimal(38,10)" in dead[3]
    assert "column big" in dead[4] and "more than 38 integer digits" not in dead[4]
    assert result.targets["db.amounts"].counts["dead_lettered"] == 2


SCHEMA = {"columns": [{"name": "id", "type": "long", "required": True}, {"name": "qty", "type": "int"},
                      {"name": "price", "type": "decimal(10,2)"}, {"name": "ratio", "type": "float"},
                      {"name": "note", "type": "string"}, {"name": "flag", "type": "boolean"}]}


def _events():
    bare = [{"id": 1, "qty": 7, "price": "12.50", "ratio": 0.5, "note": "plain", "flag": True},
            {"id": 2, "qty": 2**40, "price": "1.00", "ratio": 1.0},                       # needs long
            {"id": 3, "qty": 1, "price": "123456789012.34", "ratio": 1.0},                # needs decimal(14,2)
            {"id": 4, "qty": 1, "price": "1.00", "ratio": 1e39},                          # needs double
            {"id": 5, "qty": 1, "price": "1.005"},                                        # scale: never fits
            {"id": 6, "qty": 1, "flag": "yes"},                                           # optional, wrong type
            {"id": 7, "qty": 1, "note": 42, "extra": "x"}]                                # stringified, ignored
    return [json.dumps({"op": "c", "after": e}) for e in bare]


@pytest.mark.parametrize("evolve", [False, True], ids=["no_evolution", "schema_evolution"])
def test_out_of_range_values_widen_or_dead_letter(spark, catalog, catalog_settings, tmp_path, evolve):
    cat = catalog_settings.name
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "001.json").write_text("\n".join(_events()) + "\n")
    settings = IngestSettings(landing=str(landing), target="db.m", identifier_columns=("id",), auto_create=True,
                              schema=SCHEMA, schema_evolution=evolve)
    [result] = _ingest(spark, catalog, cat, settings)
    counts = result.targets["db.m"].counts
    types = {f.name: f.dataType.simpleString() for f in spark.table(f"{cat}.db.m").schema.fields}
    rows = {r.id: r.asDict() for r in spark.table(f"{cat}.db.m").collect()}
    reasons = {json.loads(r.raw)["after"]["id"]: r.reason for r in spark.table(f"{cat}.db.m__dead_letters").collect()}
    assert rows[1] == {"id": 1, "qty": 7, "price": Decimal("12.50"), "ratio": 0.5, "note": "plain", "flag": True,
                       **({"extra": None} if evolve else {})}
    assert rows[7]["note"] == "42" and counts["stringified"] == 1
    assert "column price" in reasons[5] and "exactly" in reasons[5]
    assert reasons[6] == "column flag: 'yes' is not a boolean"
    if evolve:
        assert types["qty"] == "bigint" and types["price"] == "decimal(14,2)" and types["ratio"] == "double"
        assert sorted(result.targets["db.m"].widened_columns) == [
            "price: decimal(10,2) -> decimal(14,2)", "qty: int -> bigint", "ratio: float -> double"]
        assert rows[2]["qty"] == 2**40 and rows[3]["price"] == Decimal("123456789012.34") and rows[4]["ratio"] == 1e39
        assert set(reasons) == {5, 6} and counts["dead_lettered"] == 2 and counts["ignored_fields"] == 0
        assert rows[7]["extra"] == "x" and result.targets["db.m"].added_columns == ("extra",)
    else:
        assert types["qty"] == "int" and types["price"] == "decimal(10,2)" and types["ratio"] == "float"
        assert set(rows) == {1, 7} and set(reasons) == {2, 3, 4, 5, 6} and counts["dead_lettered"] == 5
        assert reasons[2] == ("column qty: 1099511627776 is out of range for int (schema_evolution is off, so the "
                              "column is not widened)")
        assert "decimal(10,2)" in reasons[3] and "14 digits" in reasons[3] and "not widened" in reasons[3]
        assert "out of range for float" in reasons[4]
        assert counts["ignored_fields"] == 1 and "extra" not in types
