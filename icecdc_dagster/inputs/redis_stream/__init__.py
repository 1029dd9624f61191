"""``input: {redis_stream: {...}}``: a Redis stream read by a consumer group."""

# A package of modules, no facade: callers import the module they need.
__all__ = ["config", "reader"]
