"""``sync_all`` (what ``icecdc sync`` runs): a table whose sink is down waits only on its own line;
the other table is synced to the end in the same call. A cluster that does not answer is a transient
failure: the line retries after its backoff, without ``--retry-failed`` and without spending
``max_retries`` (0 here)."""

from icecdc_dagster.config import load_config
from icecdc_dagster.definitions import build_definitions
from icecdc_dagster.sync import sync_all
from tests.helpers import write_pipeline


def test_one_blocked_table_does_not_stop_the_other(spark, catalog_settings, catalog, tmp_path, proxy, instance,
                                                   monkeypatch):
    from icecdc_dagster.lease import retry

    monkeypatch.setattr(retry, "RETRY_BACKOFF_S", 600.0)
    cat = catalog_settings.name
    for name in ("a", "b"):
        spark.sql(f"CREATE TABLE {cat}.db.{name} (id BIGINT NOT NULL, v STRING) USING iceberg")
        spark.sql(f"INSERT INTO {cat}.db.{name} VALUES (1, 'x'), (2, 'y')")
        spark.sql(f"UPDATE {cat}.db.{name} SET v = 'z' WHERE id = 2")
    config = load_config(write_pipeline(tmp_path / "p.yaml", catalog_settings, [
        {"table_name": "db.a", "identifier_columns": ["id"], "max_retries": 0,
         "sinks": [{"opensearch": {"hosts": [proxy.url], "index": "a", "max_retries": 1, "request_timeout_s": 5}}]},
        {"table_name": "db.b", "identifier_columns": ["id"], "sinks": [{"iceberg": {"table_name": "db.b_copy"}}]}]))
    defs = build_definitions(config)
    proxy.cut()
    blocked, flowing = sync_all(config, defs, instance)
    assert blocked.table_name == "db.a" and not blocked.ok and [ok for *_, ok in blocked.runs] == [False]
    assert blocked.blocked is None and "transient" in blocked.waiting and "retried in" in blocked.waiting
    assert "WAITING" in blocked.render()
    assert flowing.ok and len(flowing.runs) == 1                   # export of b

    spark.sql(f"INSERT INTO {cat}.db.b VALUES (3, 'w')")
    proxy.restore()
    waiting, flowing = sync_all(config, defs, instance)            # within the backoff: a waits, b flows
    assert not waiting.ok and waiting.runs == [] and "transient" in waiting.waiting
    assert flowing.ok and len(flowing.runs) == 1
    assert sorted((r.id, r.v) for r in spark.table(f"{cat}.db.b_copy").collect()) == [
        (1, "x"), (2, "z"), (3, "w")]

    monkeypatch.setattr(retry, "RETRY_BACKOFF_S", 0.0)             # the backoff has passed
    resumed, unchanged = sync_all(config, defs, instance)          # a plain sync, no --retry-failed
    assert resumed.ok and [ok for *_, ok in resumed.runs] == [True]
    assert unchanged.ok and unchanged.runs == []
