"""Pure rules behind what `icecdc sync` reports: its exit status from its lines' reports, and the keys of a
batch run that its ``no_stuck_snapshots`` check counts neither as stuck nor as pending."""

from icecdc_dagster.checks.stuck import after_batch
from icecdc_dagster.cli import EXIT_BLOCKED, EXIT_BUSY, EXIT_CHECK_FAILED, exit_status
from icecdc_dagster.sync import FailedCheck, TableSyncReport

FAILED = FailedCheck("replica/db/items_copy", "sink_counts_agree", "7")


def test_exit_status_is_the_most_serious_line_and_a_failed_check_is_not_ok():
    ok = TableSyncReport("db.a", runs=[("1", "1", True)])
    checked = TableSyncReport("db.b", runs=[("5", "7", True)], failed_checks=[FAILED])
    busy = TableSyncReport("db.c", busy="held by pid 9")
    blocked = TableSyncReport("db.d", runs=[("3", "3", False)])
    assert exit_status([ok]) == 0
    assert exit_status([ok, checked]) == EXIT_CHECK_FAILED == 3
    assert exit_status([busy, ok]) == EXIT_BUSY == 75
    assert exit_status([busy, checked]) == 3
    assert exit_status([checked, blocked, busy]) == EXIT_BLOCKED == 1
    assert checked.ok and checked.render() == ("db.b: 1/1 runs succeeded; CHECKS FAILED: replica/db/items_copy "
                                               "sink_counts_agree at snapshot 7")
    assert ok.render() == "db.a: 1/1 runs succeeded; ok"


def test_a_batch_runs_own_snapshots_are_not_stuck():
    """Judged as the batch leaves the line: its own keys are neither stuck nor pending (issue 44, item 2)."""
    waiting = ["1", "2", "3", "4"]
    assert after_batch(waiting, ("1", "3")) == ["4"]
    assert after_batch(waiting, ("2", None)) == ["1", "3", "4"]
    assert after_batch(waiting, ("9", "9")) == waiting        # a run of keys no longer pending
    assert after_batch(waiting, (None, None)) == waiting      # the check invoked outside a run
