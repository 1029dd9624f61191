"""Ingest inputs: where a batch of Debezium events comes from (landing files, NATS JetStream, Redis Streams).

One contract (:mod:`.base`): read a bounded batch, commit it to Iceberg (the batch's position range is the
batch id in the commit: the exactly-once ledger), then acknowledge it to the broker. One folder per kind,
registered in :mod:`.registry`, like sinks.
"""

# A package of modules, no facade: callers import the module they need.
__all__ = ["base", "nats_jetstream", "redis_stream", "registry"]
