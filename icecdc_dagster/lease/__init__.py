"""Who executes a line's run, whether that process is still alive, and the lock that lets only one
writer work on a line at a time. A crashed writer loses its lock with its process and its runs are
failed over by the next sync or sensor tick, so a crash never needs a person."""

# A package of modules, no facade: callers import the module they need.
__all__ = ["dagster_yaml", "executor", "failover", "holder", "line_lock", "lock_contract", "pg_lock", "retry",
           "run_thread"]
