"""Asset checks: the line follows its table, no batch is stuck (one step per batch run); sinks agree with
their source."""

# A package of modules, no facade: callers import the module they need.
__all__ = ["check_run", "line_checks", "line_continues", "sinks_agree", "stuck"]
