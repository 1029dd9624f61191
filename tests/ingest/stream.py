"""A generated Debezium stream and its independently computed expected final state (test helper)."""

import base64
import datetime as dt
import json
import uuid
from decimal import Decimal

EPOCH = dt.datetime(1970, 1, 1)
UTC = dt.UTC


def _f(name, type_, optional=True, logical=None, params=None, **extra):
    out = {"field": name, "type": type_, "optional": optional, **extra}
    if logical:
        out["name"] = logical
    if params:
        out["parameters"] = params
    return out


CUSTOMER_FIELDS = [
    _f("id", "int32", optional=False),
    _f("name", "string"),
    _f("balance", "bytes", logical="org.apache.kafka.connect.data.Decimal",
       params={"scale": "2", "connect.decimal.precision": "10"}),
    _f("birth", "int32", logical="io.debezium.time.Date"),
    _f("wake", "int64", logical="io.debezium.time.MicroTime"),
    _f("wake_ms", "int32", logical="io.debezium.time.Time"),
    _f("created", "int64", logical="io.debezium.time.MicroTimestamp"),
    _f("created_ms", "int64", logical="io.debezium.time.Timestamp"),
    _f("created_ns", "int64", logical="io.debezium.time.NanoTimestamp"),
    _f("updated", "string", logical="io.debezium.time.ZonedTimestamp"),
    _f("uid", "string", logical="io.debezium.data.Uuid"),
    _f("meta", "string", logical="io.debezium.data.Json"),
    _f("ratio", "struct", logical="io.debezium.data.VariableScaleDecimal",
       fields=[_f("scale", "int32", optional=False), _f("value", "bytes", optional=False)]),
    _f("blob", "bytes"),
    _f("active", "boolean"),
    _f("score", "float64"),
    _f("tags", "array", items={"type": "string", "optional": True}),
]
EMAIL = _f("email", "string")


def _unscaled_b64(d: Decimal, scale: int) -> str:
    n = int(d.scaleb(scale))
    return base64.b64encode(n.to_bytes((n.bit_length() + 8) // 8 or 1, "big", signed=True)).decode()


def customer(i: int, version: int, with_email: bool):
    """(wire image, expected row) for customer i at a version."""
    balance = Decimal(i * 100 + version).scaleb(-2)
    birth = dt.date(1990, 1, 1) + dt.timedelta(days=i)
    created = dt.datetime(2024, 1, 1, 12) + dt.timedelta(seconds=i, microseconds=version)
    updated = dt.datetime(2024, 2, 1, 8, tzinfo=dt.timezone(dt.timedelta(hours=2))) + dt.timedelta(minutes=version)
    uid = str(uuid.UUID(int=i * 1000 + version))
    ratio = Decimal(f"{i}.{version:03d}")
    wire = {
        "id": i, "name": f"c{i}v{version}", "balance": _unscaled_b64(balance, 2),
        "birth": (birth - dt.date(1970, 1, 1)).days, "wake": (3600 + i) * 1_000_000 + 5, "wake_ms": (60 + i) * 1000,
        "created": int((created - EPOCH).total_seconds()) * 1_000_000 + created.microsecond,
        "created_ms": int((created - EPOCH).total_seconds() * 1000) // 1000 * 1000,
        "created_ns": (int((created - EPOCH).total_seconds()) * 1_000_000 + created.microsecond) * 1000,
        "updated": updated.isoformat(), "uid": uid, "meta": json.dumps({"v": version}),
        "ratio": {"scale": 3, "value": _unscaled_b64(ratio, 3)},
        "blob": base64.b64encode(bytes([i % 256, version % 256])).decode(), "active": version % 2 == 0,
        "score": i / 4, "tags": [f"t{version}"],
    }
    expected = {
        "id": i, "name": f"c{i}v{version}", "balance": balance, "birth": birth,
        "wake": (dt.datetime.min + dt.timedelta(seconds=3600 + i, microseconds=5)).time().isoformat("microseconds"),
        "wake_ms": (dt.datetime.min + dt.timedelta(seconds=60 + i)).time().isoformat("microseconds"),
        "created": created, "created_ms": created.replace(microsecond=0), "created_ns": created,
        "updated": updated.astimezone(UTC).replace(tzinfo=None), "uid": uid, "meta": json.dumps({"v": version}),
        "ratio": ratio, "blob": bytes([i % 256, version % 256]), "active": version % 2 == 0, "score": i / 4,
        "tags": [f"t{version}"],
    }
    if with_email:
        wire["email"] = expected["email"] = f"c{i}@x.org"
    return wire, expected


def envelope(op, before, after, table, fields, ts=0):
    value_schema = {"type": "struct", "optional": True, "name": f"srv.inventory.{table}.Value", "fields": fields}
    schema = {"type": "struct", "name": f"srv.inventory.{table}.Envelope", "fields": [
        {**value_schema, "field": "before"}, {**value_schema, "field": "after"},
        {"type": "struct", "field": "source", "fields": []}, {"type": "string", "field": "op"},
        {"type": "int64", "field": "ts_ms", "optional": True}]}
    payload = {"op": op, "before": before, "after": after, "ts_ms": ts,
               "source": {"connector": "postgresql", "schema": "inventory", "table": table}}
    return json.dumps({"schema": schema, "payload": payload})


def order(op, before, after):
    """Bare payload (no schema block): types are inferred."""
    return json.dumps({"op": op, "before": before, "after": after,
                       "source": {"schema": "inventory", "table": "orders"}})


class Stream:
    """Builds landing files and tracks the expected tables and dead letters."""

    def __init__(self):
        self.customers: dict[int, dict] = {}
        self.orders: dict[int, dict] = {}
        self.bad_customers: list[str] = []
        self.bad_unrouted: list[str] = []
        self.bad_orders: list[str] = []

    def files(self):
        f1, f2, f3 = [], [], []
        # file 1: snapshot reads then stream; insert+delete of key 9 in one batch; tombstone; malformed line
        for i in range(1, 7):
            wire, exp = customer(i, 0, False)
            f1.append(envelope("r", None, wire, "customers", CUSTOMER_FIELDS))
            self.customers[i] = exp
        wire, exp = customer(2, 1, False)
        f1.append(envelope("u", customer(2, 0, False)[0], wire, "customers", CUSTOMER_FIELDS))
        self.customers[2] = exp
        wire9, _ = customer(9, 0, False)
        f1.append(envelope("c", None, wire9, "customers", CUSTOMER_FIELDS))
        f1.append(envelope("d", wire9, None, "customers", CUSTOMER_FIELDS))
        f1.append("null")
        bad = '{"schema": {"type": "struct"}, "payload": {"op": "c", "after": {"id": 1'
        f1.append(bad)
        self.bad_unrouted.append(bad)
        for k in range(1, 5):
            row = {"order_id": k, "customer": k, "amount": k * 1.5, "note": f"o{k}", "lines": [{"sku": "a", "n": k}]}
            f1.append(order("c", None, row))
            self.orders[k] = {**row, "lines": [{"sku": "a", "n": k}]}
        # file 2: out-of-batch updates and deletes, schema change (email), wrong types, unknown op
        for i in (1, 3):
            wire, exp = customer(i, 2, True)
            f2.append(envelope("u", None, wire, "customers", CUSTOMER_FIELDS + [EMAIL]))
            self.customers[i] = exp
        f2.append(envelope("d", customer(4, 0, False)[0], None, "customers", CUSTOMER_FIELDS))
        del self.customers[4]
        wire, exp = customer(7, 0, True)
        f2.append(envelope("c", None, wire, "customers", CUSTOMER_FIELDS + [EMAIL]))
        self.customers[7] = exp
        bad_key = envelope("c", None, {**customer(8, 0, False)[0], "id": "eight"}, "customers",
                           [_f("id", "string", optional=False)] + CUSTOMER_FIELDS[1:])
        f2.append(bad_key)
        self.bad_customers.append(bad_key)
        unknown_op = envelope("x", None, customer(10, 0, False)[0], "customers", CUSTOMER_FIELDS)
        f2.append(unknown_op)
        self.bad_customers.append(unknown_op)
        f2.append(order("u", None, {"order_id": 2, "customer": 2, "amount": "3.25", "note": "o2b",
                                    "lines": [{"sku": "b", "n": 9}]}))
        self.orders[2] = {"order_id": 2, "customer": 2, "amount": 3.25, "note": "o2b", "lines": [{"sku": "b", "n": 9}]}
        f2.append(order("d", {"order_id": 3}, None))
        del self.orders[3]
        wrong_optional = order("u", None, {"order_id": 4, "customer": "four", "amount": 6.0, "note": "o4b"})
        f2.append(wrong_optional)  # customer is optional, yet never silently nulled: a dead letter
        self.bad_orders.append(wrong_optional)
        bad_order_key = order("c", None, {"order_id": "x", "amount": 1.0})
        f2.append(bad_order_key)
        self.bad_orders.append(bad_order_key)
        # file 3: a batch that only deletes and re-inserts
        wire, exp = customer(5, 3, True)
        f3.append(envelope("d", customer(5, 0, False)[0], None, "customers", CUSTOMER_FIELDS))
        f3.append(envelope("c", None, wire, "customers", CUSTOMER_FIELDS + [EMAIL]))
        self.customers[5] = exp
        return ["\n".join(f1) + "\n", "\n".join(f2) + "\n", "\n".join(f3)]
