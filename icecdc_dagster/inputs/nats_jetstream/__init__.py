"""``input: {nats_jetstream: {...}}``: a durable JetStream pull consumer on a subject filter."""

# A package of modules, no facade: callers import the module they need.
__all__ = ["config", "reader"]
