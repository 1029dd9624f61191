"""Asset checks: sinks agree with their source; no batch is stuck."""
