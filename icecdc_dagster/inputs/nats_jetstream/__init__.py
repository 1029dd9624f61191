"""``input: {nats_jetstream: {...}}``: a durable JetStream pull consumer on a subject filter."""
