"""A bounded ledger: a retention drops the entries stamped before its horizon, the open chunk's at once and a
sealed chunk (never rewritten) as a whole; the appended entry is always kept; the highest dropped stamp is kept."""

from icecdc_dagster.writer.exactly_once import (
    LEDGER_DROPPED_PROPERTY,
    LEDGER_PROPERTY,
    LEDGER_SEALED_PREFIX,
    LedgerRetention,
    ledger_changes,
    ledger_dropped_upto,
    ledger_entries,
)


def _apply(props: dict[str, str], entry: dict[str, str], keep_from: int, chunk: int = 3) -> None:
    changes = ledger_changes(props, entry, chunk, LedgerRetention("t", keep_from))
    for key in changes.removals:
        assert key.startswith(LEDGER_SEALED_PREFIX)
        del props[key]
    props.update(changes.updates)


def test_the_ledger_stays_bounded_over_many_batches():
    props: dict[str, str] = {}
    window = 10
    for n in range(200):
        _apply(props, {"icecdc.batch-id": f"b{n}", "t": str(n)}, keep_from=n - window)
        stamps = [int(e["t"]) for e in ledger_entries(props)]
        assert stamps[-1] == n and all(s >= n - window - 3 for s in stamps)   # at most one chunk beyond
        assert set(range(max(n - window, 0), n + 1)) <= set(stamps)            # nothing within the horizon lost
        assert len(props) <= 2 + (window + 3) // 3 + 1
    assert ledger_dropped_upto(props) == 200 - 1 - window - 1


def test_the_appended_entry_is_kept_and_entries_without_a_stamp_stay():
    props = {LEDGER_PROPERTY: ""}
    _apply(props, {"icecdc.batch-id": "legacy"}, keep_from=100)
    _apply(props, {"icecdc.batch-id": "old", "t": "5"}, keep_from=100)   # taken past the horizon: kept now
    assert [e["icecdc.batch-id"] for e in ledger_entries(props)] == ["legacy", "old"]
    assert LEDGER_DROPPED_PROPERTY not in props
    _apply(props, {"icecdc.batch-id": "new", "t": "120"}, keep_from=100)  # ... and dropped by the next publish
    assert [e["icecdc.batch-id"] for e in ledger_entries(props)] == ["legacy", "new"]
    assert ledger_dropped_upto(props) == 5
