"""How ``icecdc status`` words a sink it can and cannot read (pure: no catalog, no instance)."""

from icecdc_dagster.status import SinkStatus, TableStatus


def _table(*sinks: SinkStatus) -> str:
    return TableStatus("demo.orders", 42, 6, 0, [], sinks=list(sinks)).render()


def test_a_sink_that_cannot_be_read_shows_why_and_claims_no_checkpoint_or_count():
    """An index whose server is gone has no known checkpoint: status must not print one, nor a number of
    snapshots it lacks (that would be a guess), only that it could not be read and why."""
    shown = _table(SinkStatus("opensearch/demo-orders", None, None, None, error="ConnectionError(refused)",
                              target="demo-orders"))
    sink_line = shown.splitlines()[1]
    assert sink_line == ("  opensearch/demo-orders: cannot be read, checkpoint unknown "
                         "(error: ConnectionError(refused)); demo-orders")
    assert "pending" not in sink_line and "None" not in sink_line


def test_a_read_sink_shows_its_checkpoint_pending_snapshots_and_lag():
    shown = _table(SinkStatus("replica/demo_replica.orders", 42, 0, 0.0, target="demo_replica.orders"),
                   SinkStatus("opensearch/demo-orders", 41, 1, 12.5))
    assert shown.splitlines()[1:] == [
        "  replica/demo_replica.orders: checkpoint 42, 0 snapshots pending, up to date; demo_replica.orders",
        "  opensearch/demo-orders: checkpoint 41, 1 snapshot pending, lag 12.5s"]
