"""The in-order rule: only the first unfinished snapshot may run; failures block the line."""

from icecdc_dagster.steps.ordering import Blocked, KeyStatus, NextRun, combine_status, plan_next_run

D, P, F, R = KeyStatus.DONE, KeyStatus.PENDING, KeyStatus.FAILED, KeyStatus.IN_PROGRESS
KEYS = ["10", "20", "30", "40"]


def plan(status, failures=None, per_run=1, retries=2):
    return plan_next_run(KEYS, dict(zip(KEYS, status)), failures or {}, per_run, retries)


def test_first_pending_key_runs_alone_or_with_a_capped_range():
    assert plan([D, P, P, P]) == NextRun("20", "20", ("20",), 1)
    assert plan([D, P, P, P], per_run=2) == NextRun("20", "30", ("20", "30"), 1)
    assert plan([P, P, P, P], per_run=10).keys == tuple(KEYS)


def test_in_progress_blocks_later_keys():
    assert isinstance(plan([D, R, P, P]), Blocked)


def test_failed_key_is_retried_before_anything_after_it_then_blocks():
    retry = plan([D, F, P, P], failures={"20": 1}, per_run=5)
    assert retry == NextRun("20", "20", ("20",), 2)
    assert retry.run_key != NextRun("20", "20", ("20",), 1).run_key
    blocked = plan([D, F, P, P], failures={"20": 3})
    assert isinstance(blocked, Blocked) and blocked.key == "20" and "failed 3 times" in blocked.reason


def test_a_range_never_runs_past_a_failed_or_done_key():
    assert plan([P, P, F, P], per_run=10).keys == ("10", "20")


def test_everything_done_means_nothing_to_run():
    assert plan([D, D, D, D]) is None


def test_combine_status_over_assets():
    assert combine_status([D, D]) is D
    assert combine_status([D, None]) is P
    assert combine_status([D, F]) is F
    assert combine_status([F, R]) is R
    assert combine_status([]) is P
