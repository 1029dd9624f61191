"""Asset checks: sinks agree with their source; no batch is stuck."""

# A package of modules, no facade: callers import the module they need.
__all__ = ["consistency", "lifecycle", "run", "stuck"]
