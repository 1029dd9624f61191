"""Property tests draw the same examples in every default run (a red CI run is red again at home) and new
ones under ``ICECDC_HYPOTHESIS_PROFILE=explore`` (docs/testing.md)."""

import os

from hypothesis import settings

from tests.ingest import test_native_rules as native_rules  # the module: its tests are not collected here


def test_the_default_run_is_reproducible_and_explore_draws_new_examples():
    exploring = os.environ.get("ICECDC_HYPOTHESIS_PROFILE") == "explore"
    assert settings.default.derandomize is not exploring
    assert settings.default.database is None            # nothing replayed from an earlier run's examples
    # A property test of the default run takes the profile (it does not pin derandomize itself) ...
    own = native_rules.test_native_rows_equal_the_python_rules._hypothesis_internal_use_settings
    assert own.derandomize is not exploring
    # ... and its deep variant under -m slow always explores.
    assert not native_rules.test_native_rows_equal_the_python_rules_deep._hypothesis_internal_use_settings.derandomize
